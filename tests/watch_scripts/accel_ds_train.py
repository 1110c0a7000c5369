"""Accelerate + ``DeepSpeedPlugin`` (ZeRO ``--stage``, GA = ``--k``) in a custom loop, 2 CPU
ranks (``torchrun``), a small classifier whose labels are ``-100`` on a random subset of
samples (uneven valid counts per micro-batch and rank), client ``SGD`` (no momentum, so an
update is ``-lr`` times the gradient the optimizer received). ``--scenario``:

``exact``  ``accumguard.integrations.accelerate.accumulator`` with the summed loss (it scales
           by the window's global count): the large-batch update.
``mean``   ``with accelerator.accumulate(model)`` and ``accelerator.backward(mean loss)``:
           each micro-batch's mean / K (F5 with uneven counts).
``gamis``  ``mean``'s loop on data with every label valid (a mean / K is then exact), but
           ``Accelerator(gradient_accumulation_steps=K)`` with a DeepSpeed config saying K/2:
           Accelerate warns and takes DeepSpeed's value; the loop steps every K/2 micro-batches.

The checks (``accumguard.integrations.accelerate.watch``) are attached in every scenario.
One Accelerator per scenario (``--scenario exact,mean,gamis`` runs them in turn); a scenario
``name@S`` runs at ZeRO stage S instead of ``--stage`` (recorded as ``name-zS``).
``--sweep DIR`` records each run in ``DIR/<scenario>`` (``accumguard.watch._recording.recording``)
and writes ``DIR/<scenario>.json`` (rank 0): the checks' findings, the relative error of the
first update against the fp64 large batch (below ZeRO-3: every rank holds the full weights),
the relative error of the final weights against the fp64 large batch trained for every step
(``final_error``: the weights gathered after the recording, so ZeRO-3 too), the engine's K.
Without ``--sweep`` it runs as is (``accumguard invariance``: ``--k {K} --mb {MB}``).
"""

import argparse
import contextlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.state import AcceleratorState
from accelerate.utils import InitProcessGroupKwargs

from accumguard.integrations.accelerate import accumulator, watch

p = argparse.ArgumentParser()
p.add_argument("--scenario", default="exact")
p.add_argument("--stage", type=int, default=2)
p.add_argument("--k", type=int, default=4)
p.add_argument("--mb", type=int, default=4)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--sweep", default=None)
args = p.parse_args()
K, MB, LR = args.k, args.mb, 0.5


def accelerator(scenario: str, stage: int) -> tuple[Accelerator, int]:
    """A fresh Accelerator per scenario (one DeepSpeed engine each) and its config's GA."""
    ds_k = K // 2 if scenario == "gamis" else K
    AcceleratorState._reset_state(True)
    plugin = DeepSpeedPlugin(hf_ds_config={
        "train_micro_batch_size_per_gpu": MB, "gradient_accumulation_steps": ds_k,
        "train_batch_size": "auto", "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": stage}})
    return Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=K,
                       kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")]), ds_k


def data(r: int, scenario: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank r's micro-batches: the same samples per optimizer step for every K."""
    g = torch.Generator().manual_seed(11 + r)
    n = args.steps * K * MB
    x = torch.randn(n, 8, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    if scenario != "gamis":  # (gamis: every label valid, so a mean / K is exact)
        y[torch.rand(n, generator=g) < 0.4] = -100  # uneven valid counts
    return [(x[i:i + MB], y[i:i + MB]) for i in range(0, n, MB)]


def large_batch(start: list[torch.Tensor], world: int, scenario: str, steps: int
                ) -> torch.nn.Sequential:
    """The fp64 large batch from ``start``: each step one SGD update on every rank's next K
    micro-batches, the summed loss divided by their valid count."""
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 5)).double()
    with torch.no_grad():
        for q, s in zip(ref.parameters(), start, strict=True):
            q.copy_(s)
    for step in range(steps):
        window = [data(r, scenario)[step * K:(step + 1) * K] for r in range(world)]
        xs = torch.cat([x for rank in window for x, _ in rank]).double()
        ys = torch.cat([y for rank in window for _, y in rank])
        ref.zero_grad()
        F.cross_entropy(ref(xs), ys, ignore_index=-100, reduction="sum").div(
            (ys != -100).sum()).backward()
        with torch.no_grad():
            for q in ref.parameters():
                q -= LR * q.grad
    return ref


def run(spec: str) -> None:
    scenario, _, st = spec.partition("@")
    stage = int(st or args.stage)
    name = spec.replace("@", "-z")
    acc, ds_k = accelerator(scenario, stage)
    rank, world = acc.process_index, acc.num_processes
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))
    start = [q.detach().clone().double() for q in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    checks = watch(acc, model, opt, every_n_steps=1)
    batches = data(rank, scenario)
    ctx = contextlib.nullcontext()
    if args.sweep:
        from accumguard.watch._recording import recording

        ctx = recording(Path(args.sweep) / name)
    first: list[torch.Tensor] = []
    with ctx:
        if scenario in ("mean", "gamis"):
            for i, (x, y) in enumerate(batches):
                with acc.accumulate(model):
                    acc.backward(F.cross_entropy(model(x), y, ignore_index=-100))
                    opt.step()
                    opt.zero_grad()
                if i == ds_k - 1:
                    first = [q.detach().clone().double() for q in model.parameters()]
        else:
            acc_ = accumulator(acc, model, opt, count_fn=lambda b: (b[1] != -100).sum())
            for w, window in enumerate(acc_.windows(batches)):
                window.run(lambda b: F.cross_entropy(model(b[0]), b[1], ignore_index=-100,
                                                     reduction="sum"))
                if w == 0:
                    first = [q.detach().clone().double() for q in model.parameters()]
    checks.close()

    if args.sweep:
        # the fp64 large batch of the first optimizer step: every rank's first K micro-batches
        ref = large_batch(start, world, scenario, 1)
        want = torch.cat([(q - s).flatten() for q, s in zip(ref.parameters(), start,
                                                            strict=True)])
        err = None
        if stage < 3:  # (ZeRO-3 partitions the parameters)
            got = torch.cat([(a - s).flatten() for a, s in zip(first, start, strict=True)])
            err = float((got - want).norm() / want.norm())
        # the final weights (gathered: ZeRO-3 holds a partition per rank) against the fp64
        # large batch trained for every step; outside the recording (the gather is ours)
        import deepspeed

        params = list(model.parameters())
        with deepspeed.zero.GatheredParameters(params):
            final = [q.detach().clone().double() for q in params]
        ref = large_batch(start, world, scenario, args.steps)
        moved = torch.cat([(q - s).flatten() for q, s in zip(ref.parameters(), start,
                                                             strict=True)])
        off = torch.cat([(a - q).flatten() for a, q in zip(final, ref.parameters(),
                                                           strict=True)])
        final_err = float(off.norm() / moved.norm())
        if rank == 0:
            Path(args.sweep, f"{name}.json").write_text(json.dumps({
                "findings": [f.as_dict() for f in checks.findings], "update_error": err,
                "final_error": final_err, "engine_k": int(acc.gradient_accumulation_steps)}))
    acc.wait_for_everyone()


for name in args.scenario.split(","):
    run(name)
torch.distributed.destroy_process_group()
print("done", args.scenario)
