"""DeepSpeed driven the way the frameworks drive it, in one 2-rank launch (``torchrun``):
``--sweep DIR`` records each scenario in its own directory
(``accumguard.watch._recording.recording``, what ``accumguard watch`` analyses) and writes the
findings of ``accumguard.integrations.accelerate.watch`` (attached to Accelerate's
``DeepSpeedOptimizerWrapper``) to ``DIR/<scenario>/checks.json`` (rank 0).

Raw DeepSpeed engines (config GA = K):

``ds_boundary``  ``set_gradient_accumulation_boundary(j == K-1)`` before each backward and one
                 ``engine.step()`` per window (DeepSpeed's documented pattern): correct.
``ds_double``    K backwards around one ``engine.step()``, no boundary calls: F14.
``ds_two_engines``  two engines (an actor and a critic), each ``engine.backward`` and
                 ``engine.step()`` per micro-batch, each with GA = K: correct.
``ds_two_engines_f1``  the same with the critic's config at GA 1: F1.

Accelerate + ``DeepSpeedPlugin`` (ZeRO-2, GA = K; ``accelerator.backward`` calls
``engine.step()`` inside it at the boundary):

``accel_ok``     ``with accelerator.accumulate(model)``: correct.
``accel_f1``     no ``accumulate()``: every backward is a boundary, a step per micro-batch (F1).
"""

import argparse
import json
from pathlib import Path

import deepspeed
import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import InitProcessGroupKwargs

from accumguard.integrations.accelerate import watch
from accumguard.watch._recording import recording

p = argparse.ArgumentParser()
p.add_argument("--sweep", required=True)
p.add_argument("--k", type=int, default=4)
args = p.parse_args()
K = args.k
OUT = Path(args.sweep)
WINDOWS = 4


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7 + rank)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g))
            for _ in range(WINDOWS * K)]


plugin = DeepSpeedPlugin(hf_ds_config={
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": K,
    "train_batch_size": "auto", "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2}})
acc = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=K,
                  kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
rank = acc.process_index

# -- raw DeepSpeed: the engine's own accumulation with explicit boundaries, and double gating
for name in ("ds_boundary", "ds_double"):
    model = mlp()
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": K,
              "train_batch_size": 4 * K * acc.num_processes, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    batches = data(rank)
    with recording(OUT / name):
        for w in range(WINDOWS if name == "ds_boundary" else K):  # double: K windows of K
            for j in range(K):
                x, y = batches[(w * K + j) % len(batches)]
                if name == "ds_boundary":
                    engine.set_gradient_accumulation_boundary(j == K - 1)
                engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
            engine.step()
    torch.distributed.barrier()

# -- two engines in one process (DeepSpeed-Chat's actor and critic), each engine.backward and
# engine.step() on every micro-batch: each engine accumulates its own K (correct), or the
# critic's config says GA 1 (it steps on every micro-batch: F1)
for name in ("ds_two_engines", "ds_two_engines_f1"):
    engines = []
    for role in ("actor", "critic"):
        ga = 1 if (role == "critic" and name.endswith("_f1")) else K
        net = mlp()
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
               "train_batch_size": 4 * ga * acc.num_processes, "gradient_clipping": 0.0,
               "zero_optimization": {"stage": 0},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
        eng, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                            config=cfg)
        engines.append(eng)
    batches = data(rank)
    with recording(OUT / name):
        for x, y in batches:
            for eng in engines:
                eng.backward(torch.nn.functional.cross_entropy(eng(x), y))
                eng.step()
    torch.distributed.barrier()

# -- Accelerate + DeepSpeed: one prepared engine, two loops
model = mlp()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt = acc.prepare(model, opt)
for name in ("accel_ok", "accel_f1"):
    checks = watch(acc, model, opt, every_n_steps=1)
    with recording(OUT / name):
        for x, y in data(rank):
            if name == "accel_f1":  # no accumulate(): sync_gradients stays True
                acc.backward(torch.nn.functional.cross_entropy(model(x), y))
            else:
                with acc.accumulate(model):
                    acc.backward(torch.nn.functional.cross_entropy(model(x), y))
                    opt.step()
                    opt.zero_grad()
    checks.close()
    if rank == 0:
        (OUT / name / "checks.json").write_text(json.dumps(
            [f.as_dict() for f in checks.findings]))
    torch.distributed.barrier()
    assert acc.sync_gradients  # each loop ends on a boundary: the next starts afresh
acc.wait_for_everyone()
torch.distributed.destroy_process_group()
print("done")
