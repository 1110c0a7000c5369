"""A DeepSpeed training script (``deepspeed ds_train.py`` style). ``--mode``:

``native`` (config GA=K, backward/step every micro-batch: correct), ``coalesce``
(config GA=1, K backwards inside ``engine.coalesce_grad_reduction()``: correct),
``boundary`` (GA=1 with ``set_gradient_accumulation_boundary``: correct on ZeRO-0/3 only
in DeepSpeed's own docs; here used on stage 3), ``manual`` (GA=1, K backwards, one
step: F2 on ZeRO-1/2), ``double`` (GA=K and a K-loop around one step: F14).
``--no-clip`` leaves gradient_clipping unset (DeepSpeed clips at 1.0: F9 with a big loss).
``--sweep DIR`` runs the SWEEP scenarios one after the other in one launch, each recorded
in its own directory by ``accumguard.watch._recording.recording``.
"""

import argparse
import contextlib

import deepspeed
import torch

p = argparse.ArgumentParser()
p.add_argument("--mode", default="native")
p.add_argument("--stage", type=int, default=2)
p.add_argument("--k", type=int, default=4)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--no-clip", action="store_true")
p.add_argument("--local_rank", type=int, default=0)
p.add_argument("--sweep", default=None, help="run every SWEEP scenario, recordings in DIR")
args = p.parse_args()

SWEEP = {  # --sweep DIR: each under its own recording, in one launch (name: mode, stage, no_clip)
    "manual_z2": ("manual", 2, False), "double_z1_noclip": ("double", 1, True),
    "coalesce_z2": ("coalesce", 2, False), "boundary_z3": ("boundary", 3, False),
    # ZeRO-0 fp32 clips in clip_fp32_gradients and keeps no norm: F9 read from there
    "native_z0_noclip": ("native", 0, True), "native_z0": ("native", 0, False),
}


def train(mode: str, stage: int, no_clip: bool) -> None:
    torch.manual_seed(0)
    ga = K if mode in ("native", "double") else 1
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
              "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    if not no_clip:
        config["gradient_clipping"] = 0.0
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    g = torch.Generator().manual_seed(torch.distributed.get_rank())

    def micro():  # noqa: ANN202
        x = torch.randn(4, 8, generator=g)
        return engine(x).pow(2).mean() * (100.0 if no_clip else 1.0)

    for _ in range(args.steps):
        if mode == "native":
            for _ in range(K):
                engine.backward(micro())
                engine.step()
        elif mode == "coalesce":
            with engine.coalesce_grad_reduction():
                for _ in range(K):
                    engine.backward(micro() / K, scale_wrt_gas=False)
            engine.step()
        elif mode == "boundary":
            for j in range(K):
                engine.set_gradient_accumulation_boundary(j == K - 1)
                engine.backward(micro() / K, scale_wrt_gas=False)
            engine.step()
        elif mode == "manual":
            for _ in range(K):
                engine.backward(micro() / K)
            engine.step()
        elif mode == "double":
            for _ in range(K):
                for _ in range(K):
                    engine.backward(micro())
                engine.step()


deepspeed.init_distributed(dist_backend="gloo")
K = args.k
if args.sweep:
    from pathlib import Path

    from accumguard.watch._recording import recording

    for name, (mode, stage, no_clip) in SWEEP.items():
        with recording(Path(args.sweep) / name):
            train(mode, stage, no_clip)
        torch.distributed.barrier()
else:
    train(args.mode, args.stage, args.no_clip)
with contextlib.suppress(Exception):
    torch.distributed.barrier()
    # a process group left to interpreter teardown sometimes aborts in C++ ("terminate
    # called without an active exception", torch 2.13 + gloo): tear it down here
    torch.distributed.destroy_process_group()
print("done", args.sweep or args.mode)
