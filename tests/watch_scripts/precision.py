"""Where the gradient accumulates, and in which dtype (F12), written the way users write it.

``python precision.py MODE [K]`` runs one loop (for ``accumguard watch``);
``python precision.py --sweep OUT_DIR NAME...`` runs several, each recorded in its own
directory by ``accumguard.watch._recording.recording`` (one process start for many loops;
under ``torchrun --nproc-per-node 2`` for the FSDP2/DeepSpeed ones).

Single process: ``bf16_plain`` (a bf16 model, K backwards summed in its .grad: F12),
``master`` (a bf16 model whose .grad sums the window, copied to fp32 master weights at the
boundary: F12), ``master_ok`` (each micro-step's bf16 .grad added into the fp32 master and
cleared: correct), ``autocast`` (fp32 parameters, bf16 autocast forward: correct),
``accumulator`` (a bf16 model under accumguard's Accumulator: fp32 accumulation, correct).
Two ranks: ``fsdp_bf16`` (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), sync
off for K-1 micro-steps: F12), ``fsdp_fp32`` (reduce_dtype=fp32: correct) (``NAME@K``: a
scenario at its own K; the FSDP2 ones are run again unrecorded and compared), ``ds_bf16``
(DeepSpeed ZeRO-2, bf16, default grad_accum_dtype: F12), ``ds_fp32`` (the same with
``data_types.grad_accum_dtype: fp32``: correct).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

STEPS, MB, D, C = 2, 2, 8, 4


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 32), torch.nn.Tanh(), torch.nn.Linear(32, C))


def batches(k: int, rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(MB, D, generator=g), torch.randint(0, C, (MB,), generator=g))
            for _ in range(k * STEPS)]


def windows(k: int, rank: int = 0):  # noqa: ANN201
    data = batches(k, rank)
    return [data[i:i + k] for i in range(0, len(data), k)]


def bf16_plain(k: int) -> None:
    model = mlp().to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for win in windows(k):
        for x, y in win:
            (F.cross_entropy(model(x.bfloat16()).float(), y) / k).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def master(k: int, per_micro: bool = False, reduce: bool = False) -> None:
    """``reduce``: the masters' gradients all-reduced by hand (data parallelism without a
    wrapper, the ranks' own data), then divided by the world size."""
    model = mlp().to(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.SGD(masters, lr=0.1)
    rank = torch.distributed.get_rank() if reduce else 0
    for win in windows(k, rank):
        for x, y in win:
            (F.cross_entropy(model(x.bfloat16()).float(), y) / k).backward()
            if per_micro:  # the fp32 sum: each micro-step's bf16 gradient moved out
                for p, m in zip(model.parameters(), masters, strict=True):
                    g = p.grad.float()
                    m.grad = g if m.grad is None else m.grad + g
                    p.grad = None
        if not per_micro:  # the bf16 sum, copied once
            for p, m in zip(model.parameters(), masters, strict=True):
                m.grad = p.grad.float()
        if reduce:
            for m in masters:
                torch.distributed.all_reduce(m.grad)
                m.grad /= torch.distributed.get_world_size()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(model.parameters(), masters, strict=True):
                p.copy_(m)


def autocast(k: int) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for win in windows(k):
        for x, y in win:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            (F.cross_entropy(out.float(), y) / k).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def accumulator(k: int) -> None:
    from accumguard import Accumulator

    model = mlp().to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acc = Accumulator(model, opt, accumulation_steps=k, count_fn=lambda b: b[0].shape[0],
                      master_weights=True)
    for window in acc.windows(batches(k)):
        window.run(lambda b: F.cross_entropy(model(b[0].bfloat16()).float(), b[1],
                                             reduction="sum"))


def fsdp(k: int, reduce: torch.dtype) -> torch.nn.Module:
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = mlp()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for win in windows(k, dist.get_rank()):
        for i, (x, y) in enumerate(win):
            model.set_requires_gradient_sync(i == k - 1)
            (F.cross_entropy(model(x).float(), y) / k).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def ds(k: int, accum: str | None) -> None:
    import deepspeed
    import torch.distributed as dist

    config: dict = {"train_micro_batch_size_per_gpu": MB, "gradient_accumulation_steps": k,
                    "gradient_clipping": 0.0, "bf16": {"enabled": True},
                    "zero_optimization": {"stage": 2},
                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    if accum:
        config["data_types"] = {"grad_accum_dtype": accum}
    model = mlp()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    for win in windows(k, dist.get_rank()):
        for x, y in win:
            engine.backward(F.cross_entropy(engine(x.bfloat16()).float(), y))
            engine.step()


SCENARIOS = {
    "bf16_plain": bf16_plain, "master": master,
    "master_ok": lambda k: master(k, per_micro=True), "autocast": autocast,
    "accumulator": accumulator,
    "master_dp": lambda k: master(k, reduce=True),
    "master_dp_ok": lambda k: master(k, per_micro=True, reduce=True),
    "fsdp_bf16": lambda k: fsdp(k, torch.bfloat16), "fsdp_fp32": lambda k: fsdp(k, torch.float32),
    "ds_bf16": lambda k: ds(k, None), "ds_fp32": lambda k: ds(k, "fp32"),
}


def _local(t: torch.Tensor) -> torch.Tensor:
    """A parameter's data on this rank (an FSDP2 DTensor's local shard)."""
    return t.to_local() if hasattr(t, "to_local") else t.data


def main() -> None:
    k = int(os.environ.get("PRECISION_K", "256"))
    dist_run = "RANK" in os.environ
    if dist_run:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    if sys.argv[1] == "--sweep":
        from accumguard.watch._recording import recording

        out = Path(sys.argv[2])
        for name in sys.argv[3:]:
            # NAME@K: that scenario at its own K; one returning its model is then run again
            # unrecorded, its parameters compared bit for bit (OUT/identical-NAME-rankR)
            base, _, own = name.partition("@")
            with recording(out / name):
                model = SCENARIOS[base](int(own) if own else k)
            if model is not None and own:
                plain = SCENARIOS[base](int(own))
                same = all(torch.equal(_local(a), _local(b)) for a, b in
                           zip(model.parameters(), plain.parameters(), strict=True))
                rank = os.environ.get("RANK", "0")
                (out / f"identical-{name}-rank{rank}").write_text(str(same))
            if dist_run:
                torch.distributed.barrier()
    else:
        SCENARIOS[sys.argv[1]](k)
    if dist_run:
        with contextlib.suppress(Exception):
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
    print("trained")


if __name__ == "__main__":
    main()
