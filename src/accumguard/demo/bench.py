"""Seconds per optimizer step of every engine adapter, side by side, on 2 gloo ranks.

What is measured (one spawn, every configuration built once, then measured in
interleaved rounds so a noisy machine slows all of them alike; the median over
rounds is reported):

* ``local``: compute only — K forward+backward passes and an optimizer step on
  each rank independently, no communication;
* ``limit``: the same compute plus ONE all-reduce of a flat fp32 buffer the size
  of all gradients: what a perfectly deferred data-parallel step costs;
* the Accumulator on DDP (deferred / eager), FSDP2 (if ``accumguard.engines.fsdp2``
  exists; deferred / eager), DeepSpeed ZeRO 1/2/3 ``eager`` (config GA = K, the
  engine's native reduction) and ``deferred`` (config GA = 1 +
  ``coalesce_grad_reduction``).

Peak memory: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is a process-lifetime
peak, so in the shared run it is reported once per rank; ``--isolated-memory``
runs every configuration in its own spawn (slower) to get a peak per
configuration.

Usage::

    python benchmarks/bench_engines.py            # full: 7 rounds x 2 steps
    python benchmarks/bench_engines.py --quick    # 3 rounds x 1 step, for a smoke check
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

DS_STAGES = (1, 2, 3)


def make_model(dim: int, hidden: int, seed: int = 0) -> nn.Module:
    """An MLP of dim→hidden→hidden→dim (about 6.3 M parameters at 512/2048)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, dim))


def sum_loss(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).sum()


def make_batches(rank: int, n: int, micro: int, dim: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(micro, dim, generator=g), torch.randn(micro, dim, generator=g))
            for _ in range(n)]


def rss_mb() -> float:
    """Current resident set size (MB), from /proc (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


# -- configurations ------------------------------------------------------------------------
# Each builder returns a function running `steps` optimizer steps on the given batches.

def _build_local(args: Any, with_allreduce: bool) -> Callable[[list], None]:
    import torch.distributed as dist

    model = make_model(args.dim, args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    numel = sum(p.numel() for p in model.parameters())
    flat = torch.zeros(numel)
    k = args.k

    def run(batches: list) -> None:
        for start in range(0, len(batches), k):
            for b in batches[start:start + k]:
                sum_loss(model, b).backward()
            if with_allreduce:
                dist.all_reduce(flat)  # the one gradient reduction a deferred step needs
            opt.step()
            opt.zero_grad(set_to_none=True)

    return run


def _run_accumulator(model: Any, opt: Any, engine: Any, k: int) -> Callable[[list], None]:
    from accumguard import Accumulator

    acc = Accumulator(model, opt, accumulation_steps=k, engine=engine)

    def run(batches: list) -> None:
        for window in acc.windows(batches):
            window.run(lambda b: sum_loss(model, b))

    return run


def _build_ddp(args: Any, sync: str, count: bool = False) -> Callable[[list], None]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumguard.engines.ddp import DDPEngine

    model = DDP(make_model(args.dim, args.hidden))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return _run_accumulator(model, opt, DDPEngine(model, sync=sync, count_collectives=count),
                            args.k)


def _build_fsdp2(args: Any, sync: str, memory: str = "sharded") -> Callable[[list], None]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from accumguard.engines.fsdp2 import FSDP2Engine

    model = make_model(args.dim, args.hidden)
    # The benchmark runs on CPU ranks (gloo): say so, or FSDP2 picks a CUDA mesh on GPU hosts.
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=False, mesh=mesh)
    fully_shard(model, reshard_after_forward=False, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine = FSDP2Engine(model, sync=sync, window_memory=memory)  # type: ignore[arg-type]
    return _run_accumulator(model, opt, engine, args.k)


def _build_deepspeed(args: Any, stage: int, sync: str) -> Callable[[list], None]:
    import deepspeed

    from accumguard.engines.deepspeed import DeepSpeedEngineAdapter

    model = make_model(args.dim, args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = {
        "train_micro_batch_size_per_gpu": args.micro,
        "gradient_accumulation_steps": 1 if sync == "deferred" else args.k,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return _run_accumulator(engine, None, DeepSpeedEngineAdapter(engine, sync=sync), args.k)


def configurations(args: Any) -> dict[str, Callable[[], Callable[[list], None]]]:
    """Name → builder, in table order."""
    cfgs: dict[str, Callable[[], Callable[[list], None]]] = {
        "local (compute only)": lambda: _build_local(args, with_allreduce=False),
        "limit (compute + 1 all-reduce)": lambda: _build_local(args, with_allreduce=True),
        "DDP deferred": lambda: _build_ddp(args, "deferred"),
        "DDP eager": lambda: _build_ddp(args, "eager"),
        "DDP deferred, counting comm hook": lambda: _build_ddp(args, "deferred", count=True),
    }
    try:
        import accumguard.engines.fsdp2  # noqa: F401
    except ImportError:
        pass
    else:
        cfgs["FSDP2 deferred"] = lambda: _build_fsdp2(args, "deferred")
        cfgs["FSDP2 eager"] = lambda: _build_fsdp2(args, "eager")
        cfgs["FSDP2 deferred, window_memory=unsharded"] = (
            lambda: _build_fsdp2(args, "deferred", "unsharded"))
    if not args.no_deepspeed:
        for stage in DS_STAGES:
            for sync in ("eager", "deferred"):
                label = "native GA" if sync == "eager" else "coalesced"
                cfgs[f"DeepSpeed ZeRO-{stage} {sync} ({label})"] = (
                    lambda s=stage, m=sync: _build_deepspeed(args, s, m))
    if args.only:
        # The reference rows stay: every ratio is measured against them in the same run.
        cfgs = {k: v for k, v in cfgs.items()
                if k.startswith(("local (compute only)", "limit"))
                or any(o.lower() in k.lower() for o in args.only)}
    return cfgs


# -- the worker ------------------------------------------------------------------------------

def _setup_worker() -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    warnings.filterwarnings("ignore")
    try:
        import logging

        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")  # reuses the existing process group
        deepspeed.utils.logger.setLevel(logging.WARNING)
    except ImportError:
        pass


def _timed(run: Callable[[list], None], batches: list) -> float:
    """Wall time of `run` on every rank, max over ranks (the step is as slow as the slowest)."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    run(batches)
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def bench_worker(rank: int, world: int, args: Any) -> dict[str, Any]:
    if not args.no_deepspeed:
        _setup_worker()
    torch.manual_seed(0)
    builders = configurations(args)
    steps, k = args.steps, args.k
    batches = make_batches(rank, steps * k, args.micro, args.dim)
    runs: dict[str, Callable[[list], None]] = {}
    rss_delta: dict[str, float] = {}
    for name, build in builders.items():
        before = rss_mb()
        runs[name] = build()
        runs[name](batches[:k])  # warm-up step (allocates gradients, optimizer state, buckets)
        rss_delta[name] = rss_mb() - before
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]  # alternate the order: no position bias
        for name in order:
            times[name].append(_timed(runs[name], batches) / steps)
    return {"times": times, "rss_delta_mb": rss_delta, "peak_rss_mb": peak_rss_mb(),
            "params": sum(p.numel() for p in make_model(args.dim, args.hidden).parameters())}


def memory_worker(rank: int, world: int, args: Any, name: str) -> float:
    if not args.no_deepspeed:
        _setup_worker()
    run = configurations(args)[name]()
    run(make_batches(rank, args.k, args.micro, args.dim))
    return peak_rss_mb()


# -- precision: bf16 parameters, fp32 vs bf16 accumulation, fp32 master weights -------------

def precision_rows(ks: tuple[int, ...] = (4, 64, 512), dim: int = 64, micro: int = 4,
                   lr: float = 1e-2) -> list[dict[str, Any]]:
    """bf16 parameters, single process, per K: bf16 accumulation (``accumulation_dtype=
    "native"``), fp32 accumulation (``"auto"``) and fp32 accumulation with fp32 master
    weights (``master_weights=True``). Relative errors of the gradient one SGD step (``lr``)
    receives, against (a) the fp64 reference of the whole batch (includes the bf16
    forward/backward of each micro-step, which no accumulation can fix) and (b) the exact
    (fp64) sum of the very bf16 micro-gradients the run computed: the accumulation error
    alone; (b) for the fp32 window sum before any cast; the relative error of the *update*
    of the weights the optimizer steps (the bf16 parameters, or the fp32 masters: the run's
    real weights) against the fp64 reference's update; seconds per optimizer step and the
    bytes of the fp32 buffers (main gradients, masters)."""
    from accumguard import Accumulator

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return ((m(b[0].to(torch.bfloat16)).float() - b[1]) ** 2).sum()

    def bf16_copy(base: nn.Module) -> nn.Module:
        m = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        m.load_state_dict(base.state_dict())
        return m.to(torch.bfloat16)

    def flat_grad(m: nn.Module) -> torch.Tensor:
        return torch.cat([p.grad.double().flatten() for p in m.parameters()
                          if p.grad is not None])

    def stepped(o: torch.optim.Optimizer) -> list[torch.Tensor]:  # masters, if swapped in
        return [p for group in o.param_groups for p in group["params"]]

    def flat(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().double().flatten() for t in ts])

    def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
        return float((x - ref).norm() / ref.norm())

    rows = []
    for k in ks:
        g = torch.Generator().manual_seed(k)
        data = [(torch.randn(micro, dim, generator=g) + 1.0, torch.randn(micro, dim, generator=g))
                for _ in range(k)]
        torch.manual_seed(0)
        base = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        base.load_state_dict(bf16_copy(base).state_dict())  # same (bf16-rounded) start
        ref = bf16_copy(base).double()
        total = sum(((ref(x.double()) - y.double()) ** 2).sum() for x, y in data)
        (total / (k * micro)).backward()
        ref_g = flat_grad(ref)
        exact = torch.zeros_like(ref_g)  # exact sum of the bf16 micro-gradients
        one = bf16_copy(base)
        for b in data:
            one.zero_grad(set_to_none=True)
            loss(one, b).backward()
            exact += flat_grad(one)
        exact /= k * micro
        for mode in ("native", "auto", "master"):
            model = bf16_copy(base)
            seen: list[torch.Tensor] = []
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            opt.register_step_pre_hook(lambda o, a, kw, s=seen: s.append(
                flat([p.grad for p in stepped(o) if p.grad is not None])))
            acc = Accumulator(model, opt, accumulation_steps=k, master_weights=mode == "master",
                              accumulation_dtype="native" if mode == "native" else "auto")
            before = flat(stepped(opt))
            main = acc.engine.main_grads
            if main is not None:
                main.keep_last = True
            t0 = time.perf_counter()
            for w in acc.windows(data):
                w.run(lambda b, m=model: loss(m, b))
            secs = time.perf_counter() - t0
            last = main.last_sum if main is not None else None
            masters = acc.masters
            rows.append({"K": k, "accumulation": acc.accumulation_dtype
                         + (" + master weights" if masters is not None else ""),
                         "error_vs_fp64": rel(seen[0], ref_g),
                         "accumulation_error": rel(seen[0], exact),
                         "fp32_sum_accumulation_error": (None if last is None else
                                                         rel(last.double(), exact)),
                         "update_error_vs_fp64": rel(flat(stepped(opt)) - before, -lr * ref_g),
                         "lr": lr, "seconds": secs,
                         "extra_bytes": (0 if main is None else main.nbytes)
                         + (0 if masters is None else masters.nbytes)})
            acc.close()
    return rows


def precision_table(rows: list[dict[str, Any]]) -> str:
    lr = rows[0]["lr"] if rows else 0.0
    lines = ["| K | accumulation | step gradient vs fp64 reference | step gradient vs exact sum "
             "of the bf16 micro-gradients | fp32 window sum vs that exact sum | update of the "
             f"stepped weights vs fp64 (SGD lr={lr:g}) | s / step | extra memory (bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        se = r["fp32_sum_accumulation_error"]
        lines.append(f"| {r['K']} | {r['accumulation']} | {r['error_vs_fp64']:.2e} | "
                     f"{r['accumulation_error']:.2e} | {'-' if se is None else f'{se:.2e}'} | "
                     f"{r['update_error_vs_fp64']:.2e} | {r['seconds']:.3f} | "
                     f"{r['extra_bytes']} |")
    return "\n".join(lines)


def chart(res: dict[str, Any], path: str) -> None:
    """PNG: × limit per configuration, RSS growth beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = {n: statistics.median(v) for n, v in res["times"].items()}
    limit = med["limit (compute + 1 all-reduce)"]
    names = list(med)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.4 * len(names) + 1.5), sharey=True)
    a.barh(names, [med[n] / limit for n in names])
    a.axvline(1.0, color="k", lw=0.8)
    a.set_xlabel("× limit (s / step, median)")
    a.invert_yaxis()
    b.barh(names, [res["rss_delta_mb"][n] for n in names], color="tab:orange")
    b.set_xlabel("RSS growth, rank 0 (MB)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# -- report --------------------------------------------------------------------------------------

def table(result: dict[str, Any], args: Any, mem: dict[str, list[float]] | None) -> str:
    times = result["times"]
    med = {n: statistics.median(v) for n, v in times.items()}
    limit = med["limit (compute + 1 all-reduce)"]
    head = ("| configuration | s / optimizer step (median) | min-max over rounds | × limit | "
            "RSS growth (MB, rank 0) |" + (" peak RSS (MB, rank 0/1) |" if mem else ""))
    lines = [head, "|" + "---|" * (5 + bool(mem))]
    for n, v in times.items():
        row = (f"| {n} | {med[n]:.3f} | {min(v):.3f}-{max(v):.3f} | {med[n] / limit:.2f} | "
               f"{result['rss_delta_mb'][n]:.0f} |")
        if mem:
            row += " " + "/".join(f"{x:.0f}" for x in mem[n]) + " |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 rounds x 1 step (smoke check)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved measurement rounds")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per measurement")
    p.add_argument("-k", "--k", type=int, default=8, help="micro-steps per optimizer step")
    p.add_argument("--micro", type=int, default=8, help="samples per micro-batch")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--no-deepspeed", action="store_true", help="skip the DeepSpeed rows")
    p.add_argument("--only", nargs="*", help="keep configurations whose name contains one of these")
    p.add_argument("--isolated-memory", action="store_true",
                   help="also measure peak RSS of each configuration in its own spawn (slow)")
    p.add_argument("--json", help="write raw results to this file")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--png", help="write a bar chart (× limit, memory) to this PNG file")
    p.add_argument("--precision", action="store_true",
                   help="only the bf16 accumulation precision table (K = 4, 64, 512)")
    args = p.parse_args(argv)
    if args.precision:
        rows = precision_rows()
        print(precision_table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    if args.quick:
        args.rounds, args.steps = 3, 1
    if not args.no_deepspeed:
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            print("deepspeed is not installed: DeepSpeed rows skipped", file=sys.stderr)
            args.no_deepspeed = True

    from accumguard import run_on_ranks

    env = {"DS_ACCELERATOR": "cpu"}
    t0 = time.perf_counter()
    results = run_on_ranks(bench_worker, 2, (args,), timeout=args.timeout, env=env)
    res = results[0]
    mem = None
    if args.isolated_memory:
        print(table(res, args, None), flush=True)  # the timings first: memory takes a while
        mem = {name: run_on_ranks(memory_worker, 2, (args, name), timeout=args.timeout, env=env)
               for name in res["times"]}
    print(f"# {datetime.date.today()}  torch {torch.__version__}  model {res['params'] / 1e6:.2f} M "
          f"params, K={args.k}, micro={args.micro}, 2 gloo ranks x 1 thread, {args.rounds} rounds "
          f"x {args.steps} steps; load average {os.getloadavg()[0]:.1f}; peak RSS over the whole run: rank 0 "
          f"{results[0]['peak_rss_mb']:.0f} MB, rank 1 {results[1]['peak_rss_mb']:.0f} MB; "
          f"wall {time.perf_counter() - t0:.0f} s")
    print(table(res, args, mem))
    if args.png:
        chart(res, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "isolated_memory": mem}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
