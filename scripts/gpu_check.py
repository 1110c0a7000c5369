"""One command for whoever has a GPU: is accumguard exact there too?

    python scripts/gpu_check.py            # all cases; a few minutes on one GPU
    python scripts/gpu_check.py --cpu      # the same cases on the CPU (a dry run, gloo)

For each engine (local; DDP, torch ZeRO-1, FSDP2, DeepSpeed ZeRO-1/2/3 on as many
ranks as there are GPUs, at least 1) and precision (fp32 with TF32 off, bf16
autocast, fp16 autocast + GradScaler for the engines that support it) it trains
3 windows of K=4 micro-batches with uneven token counts through the Accumulator
on the device, and compares the update after every step with the single-process
fp64 reference computed on the CPU. It also counts the host synchronisations of
one window with ``torch.cuda.set_sync_debug_mode`` (reported, not failed: the
fast path should have at most one per window) and prints a table.

Without CUDA it says so and runs the dry run on the CPU (exit 0 when every case
matches). Exit 1 when a case fails its tolerance, 2 when the environment cannot
run a case at all (the reason is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import torch

K = 4
STEPS = 3
# Tolerances on ||Δθ - Δθ_ref|| / ||Δθ_ref|| against the fp64 CPU reference. fp32 with TF32
# off is the mission's criterion; the low-precision ones are what autocast alone costs on
# this model (measured against the same fp64 reference), with a 3x margin.
TOL = {"fp32": 1e-5, "bf16": 5e-2, "fp16": 1e-2}
ENGINES = ("local", "ddp", "zero1", "fsdp2", "ds1", "ds2", "ds3")


def _data(world: int) -> list[list[dict[str, torch.Tensor]]]:
    from accumguard.demo.toy import make_rank_batches

    return make_rank_batches(seed=3, world_size=world, micro_batches=K * STEPS)


def _model() -> torch.nn.Module:
    from accumguard.demo.toy import TokenMLP

    torch.manual_seed(7)
    return TokenMLP()


def _make_opt(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def _snapshot(model: Any, engine: str) -> dict[str, torch.Tensor]:
    """Full (unsharded) parameters on the CPU in fp64, keyed like the plain model."""
    out: dict[str, torch.Tensor] = {}
    if engine == "ds3":
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.module.parameters())):
            for n, p in model.module.named_parameters():
                out[n] = p.detach().double().cpu().clone()
        return out
    module = model.module if hasattr(model, "module") else model
    for n, p in module.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[n] = t.detach().double().cpu().clone()
    return out


def _wrap(engine: str, model: torch.nn.Module, device: torch.device, world: int) -> tuple[Any, Any]:
    cuda = device.type == "cuda"
    if engine == "local":
        return model, _make_opt(model.parameters())
    if engine in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if cuda else None)
        if engine == "ddp":
            return ddp, _make_opt(ddp.parameters())
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD,
                                            lr=0.5, momentum=0.9)
    if engine == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))  # explicit: never a CUDA mesh under gloo
        for sub in model.children():
            fully_shard(sub, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, _make_opt(model.parameters())
    import deepspeed

    stage = int(engine[-1])
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "train_batch_size": 4 * world, "gradient_clipping": 0.0,
           "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": stage}}
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=_make_opt(model.parameters()),
                                        config=cfg)
    return eng, None


def _worker(rank: int, world: int, engine: str, precision: str, device_kind: str) -> dict[str, Any]:
    from accumguard import Accumulator
    from accumguard.demo.toy import count_tokens, token_loss

    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    model = _model().to(device)
    wrapped, opt = _wrap(engine, model, device, world)
    scaler = None
    if precision == "fp16":
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 10)
    acc = Accumulator(wrapped, opt, accumulation_steps=K, count_fn=count_tokens, scaler=scaler)
    batches = [{k: v.to(device) for k, v in b.items()} for b in _data(world)[rank]]
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    snaps, syncs = [], []
    for i, window in enumerate(acc.windows(batches)):
        record = device.type == "cuda" and i == 1
        if record:
            torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for micro in window:
                with micro:
                    if amp is not None:
                        with torch.autocast(device.type, dtype=amp):
                            loss, _ = token_loss(wrapped, micro.batch)
                    else:
                        loss, _ = token_loss(wrapped, micro.batch)
                    micro.backward(loss)
        if record:
            torch.cuda.set_sync_debug_mode(0)
            syncs.append(sum("synchroniz" in str(w.message).lower() for w in caught))
        snaps.append(_snapshot(wrapped, engine))
    return {"snaps": snaps, "syncs": syncs}


def _reference(world: int) -> Any:
    from accumguard.demo.toy import token_loss
    from accumguard.verify.reference import reference_run, windows_for_reference

    return reference_run(_model(), _make_opt, windows_for_reference(_data(world), K), token_loss)


def _errors(result: dict[str, Any], ref: Any) -> list[float]:
    """Relative error of the update since the start, after every step (the tests' measure)."""
    from accumguard.verify.reference import canonical_name, relative_update_error

    if len(result["snaps"]) != len(ref.params):
        return [float("inf")]
    return [relative_update_error(ref.initial, {canonical_name(n): t for n, t in snap.items()},
                                  after)
            for snap, after in zip(result["snaps"], ref.params, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="force the CPU dry run")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    from accumguard.runtime.launch import run_on_ranks

    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda:
        print("no CUDA device visible: CPU dry run (gloo). On a GPU host this checks nccl.")
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    world = max(1, torch.cuda.device_count()) if cuda else 1
    backend = "nccl" if cuda else "gloo"
    precisions = ["fp32", "bf16", "fp16"] if cuda else ["fp32", "bf16"]
    rows, worst = [], 0
    ref = _reference(world)
    for precision in precisions:
        for engine in args.engines.split(","):
            if engine.startswith("ds") and precision != "fp32":
                continue  # DeepSpeed runs low precision through its own config, not autocast
            if precision == "fp16" and engine in ("fsdp2",):
                continue
            t0 = time.perf_counter()
            try:
                if engine == "local":
                    res = [_worker(0, 1, engine, precision, "cuda" if cuda else "cpu")]
                else:
                    res = run_on_ranks(_worker, world, (engine, precision,
                                                        "cuda" if cuda else "cpu"),
                                       timeout=args.timeout, backend=backend,
                                       env={"DS_ACCELERATOR": os.environ["DS_ACCELERATOR"]})
            except Exception as e:  # noqa: BLE001 - reported per case, the run goes on
                last = [ln for ln in str(e).splitlines() if ln.strip()][-1:] or [""]
                rows.append((engine, precision, "ERROR", f"{type(e).__name__}: {last[0]}"[:100],
                             "", ""))
                worst = max(worst, 2)
                continue
            err = max(_errors(res[0], ref))
            tol = TOL[precision]
            ok = err <= tol
            worst = max(worst, 0 if ok else 1)
            syncs = ",".join(str(s) for s in res[0]["syncs"]) or "-"
            rows.append((engine, precision, "PASS" if ok else "FAIL", f"{err:.2e} (tol {tol:g})",
                         syncs, f"{time.perf_counter() - t0:.1f}s"))
    head = ("engine", "precision", "verdict", "max rel. update error", "host syncs/window",
            "time")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    print(f"device: {'cuda x' + str(world) if cuda else 'cpu (dry run)'}; exit {worst}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
