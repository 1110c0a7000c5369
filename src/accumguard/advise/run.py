"""``accumguard advise``: the user's unmodified command run once per candidate mode, measured.

Every run goes through ``watch``'s bootstrap (:func:`accumguard.watch._recording.observed_env`:
the observer and its collective ledger in every rank, the parameter updates recorded, a
clean stop after ``steps`` optimizer steps, the same seed in every run); a mode is applied
inside the command by :mod:`accumguard.runtime._advise_modes` (``ACCUMGUARD_ADVISE_MODE``),
never by editing a file. The command as written runs first: its recording gives the engine
and K, and its updates are what every mode's updates are compared with (``invariance``'s
comparison, :func:`accumguard.invariance._compare.compare_runs`).

Per mode: seconds per optimizer step (each step's window, previous step end to this step
end, slowest rank, the first step left out as warm-up: median and min..max), gradient and
parameter collectives and bytes per step (the ledger, rank 0, median over steps; calls of
under 64 bytes, scalars, left out), peak
memory (the largest rank's: CUDA max allocated on GPU, else the process's peak RSS, labelled
as such), and the update comparison.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accumguard.advise._modes import AS_WRITTEN, UNAPPLIABLE, Mode, candidates, not_applicable
from accumguard.invariance._compare import compare_runs, invariance_tolerance
from accumguard.invariance._options import ENV_SEED, CommandFailedError
from accumguard.invariance._records import load_run
from accumguard.invariance._run import _run_child
from accumguard.observe._comm_rules import GRAD_OPS
from accumguard.observe.rules import load_recordings
from accumguard.runtime._advise_modes import DS_COALESCED, ENV_ADVISE_K, ENV_ADVISE_MODE
from accumguard.watch._recording import observed_env

__all__ = ["AdviseOptions", "AdviseReport", "ModeResult", "run_advise"]

#: Collectives moving less than this per call are not counted (a DeepSpeed overflow check,
#: a token count): they are not the gradient or parameter traffic a mode changes.
SCALAR_BYTES = 64


@dataclass(frozen=True, kw_only=True)
class AdviseOptions:
    """``command``: the training command; ``steps``: optimizer steps per run (>= 2: the
    first is warm-up); ``memory_budget``: bytes a mode's peak may use (None: any);
    ``timeout``: seconds per run; ``seed``: the seed every run starts from; ``only``: run
    only the modes of these names (None: every candidate; the command
    as written always runs)."""

    command: Sequence[str]
    steps: int = 6
    only: Sequence[str] | None = None
    memory_budget: int | None = None
    timeout: float = 600.0
    seed: int = 0
    out_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("advise needs a command: accumguard advise -- torchrun ... train.py")
        if self.steps < 2:
            raise ValueError(f"steps ({self.steps}) must be >= 2: the first optimizer step is "
                             "warm-up and is not timed")


@dataclass
class ModeResult:
    """One mode's measurements (``error``: why it did not run or cannot apply)."""

    mode: Mode
    seconds: list[float] = field(default_factory=list)  # per measured optimizer step
    grad_calls: float | None = None
    grad_bytes: float | None = None
    param_calls: float | None = None
    param_bytes: float | None = None
    peak_bytes: int | None = None
    memory_kind: str = ""  # "CUDA max allocated" | "peak RSS (CPU)"
    update_rel_diff: float | None = None
    equal: bool | None = None  # updates equal the command's own, within tolerance
    fits: bool = True
    error: str | None = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.name, "what": self.mode.what, "how": self.mode.how,
                "seconds_per_step": {"median": self.median_s,
                                     "min": min(self.seconds, default=None),
                                     "max": max(self.seconds, default=None),
                                     "steps": len(self.seconds)},
                "gradient_collectives_per_step": self.grad_calls,
                "gradient_bytes_per_step": self.grad_bytes,
                "parameter_collectives_per_step": self.param_calls,
                "parameter_bytes_per_step": self.param_bytes,
                "peak_memory_bytes": self.peak_bytes, "memory_kind": self.memory_kind,
                "update_rel_diff": self.update_rel_diff, "updates_equal": self.equal,
                "fits_budget": self.fits, "error": self.error}


@dataclass
class AdviseReport:
    command: list[str]
    engine: str
    k: int
    world: int
    tolerance: float
    memory_budget: int | None
    results: list[ModeResult]
    why_not: str | None  # no mode but the command as written applies
    recommended: ModeResult | None
    basis: str = ""  # why ``recommended`` was chosen: measured faster, or a tie on time

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "engine": self.engine, "accumulation_steps": self.k,
                "world_size": self.world, "tolerance": self.tolerance,
                "memory_budget_bytes": self.memory_budget, "not_applicable": self.why_not,
                "modes": [r.to_dict() for r in self.results],
                "recommended": None if self.recommended is None else {
                    "mode": self.recommended.mode.name, "how": self.recommended.mode.how,
                    "basis": self.basis}}


def _measure(res: ModeResult, observe_dir: Path) -> tuple[str, int, int, int | None]:
    """Fill ``res`` from one run's recording; returns (engine, K, world, ZeRO stage)."""
    rec = load_recordings(observe_dir)
    applied = [a for e in rec.end.values() for a in e.get("advise_applied") or []]
    if res.mode is not AS_WRITTEN and not applied:
        raise CommandFailedError(f"{res.mode.name} could not be applied: the command never "
                                 "reached the switch this mode sets (another engine version "
                                 "or a model built differently)", k=0, exit_code=None)
    if res.mode.name in DS_COALESCED and "coalesced reduction" not in applied:
        raise CommandFailedError(
            f"{res.mode.name} does not apply: every engine.backward of the command is "
            "already at DeepSpeed's accumulation boundary (config gradient_accumulation_steps "
            "1: the loop coalesces or steps every backward itself)", k=0, exit_code=None)
    ranks = sorted(rec.steps)
    if not ranks or not rec.steps[ranks[0]]:
        raise CommandFailedError(f"{res.mode.name}: the command recorded no optimizer step "
                                 "(is it a training command?)", k=0, exit_code=None)
    first = rec.steps[ranks[0]]
    engine = str(next((s.get("engine") for s in first if s.get("engine")), "local"))
    k = Counter(int(s.get("backwards", 0)) for s in first).most_common(1)[0][0]
    n = min(len(rec.steps[r]) for r in ranks)
    res.seconds = [max(float((rec.steps[r][i].get("comm") or {}).get("window_s", 0.0))
                       for r in ranks) for i in range(1, n)]
    grads, gbytes, params, pbytes = [], [], [], []
    for s in first[1:n]:
        g = gb = p = pb = 0
        for op, _micro, _in_bw, calls, nbytes, _secs in (s.get("comm") or {}).get("rows", []):
            if int(nbytes) < SCALAR_BYTES * int(calls):
                continue  # scalars: an overflow check, a token count
            if op in GRAD_OPS:
                g, gb = g + int(calls), gb + int(nbytes)
            elif op.startswith(("all_gather", "allgather")):
                p, pb = p + int(calls), pb + int(nbytes)
        grads.append(g)
        gbytes.append(gb)
        params.append(p)
        pbytes.append(pb)
    if grads:
        res.grad_calls, res.grad_bytes = statistics.median(grads), statistics.median(gbytes)
        res.param_calls, res.param_bytes = statistics.median(params), statistics.median(pbytes)
    cuda = [int(e["cuda_max_allocated_bytes"]) for e in rec.end.values()
            if e.get("cuda_max_allocated_bytes") is not None]
    rss = [int(e["peak_rss_bytes"]) for e in rec.end.values() if e.get("peak_rss_bytes")]
    if cuda:
        res.peak_bytes, res.memory_kind = max(cuda), "CUDA max allocated"
    elif rss:
        res.peak_bytes, res.memory_kind = max(rss), "peak RSS (CPU)"
    stage = next((e.get("zero_stage") for e in rec.engine.values()
                  if e.get("zero_stage") is not None), None)
    return engine, k, rec.world, stage


def _run(mode: Mode, opts: AdviseOptions, root: Path, k: int | None) -> Path:
    out = root / mode.name
    env = observed_env(os.environ, out, record_updates=True, max_steps=opts.steps)
    env.update({ENV_SEED: str(opts.seed), "PYTHONHASHSEED": str(opts.seed),
                "PYTHONUNBUFFERED": "1"})
    env.pop(ENV_ADVISE_MODE, None)
    if mode is not AS_WRITTEN:
        env[ENV_ADVISE_MODE] = mode.name
        env[ENV_ADVISE_K] = str(k)
    code, _ = _run_child(list(opts.command), env, opts.timeout, k or 0)
    if code != 0:
        raise CommandFailedError(f"{mode.name}: the command exited with code {code}",
                                 k=k or 0, exit_code=code)
    return out


def run_advise(opts: AdviseOptions) -> AdviseReport:
    """Run the command as written, then once per candidate mode of its engine."""
    with tempfile.TemporaryDirectory(prefix="accumguard-advise-") as tmp:
        root = Path(opts.out_dir) if opts.out_dir is not None else Path(tmp)
        base = ModeResult(AS_WRITTEN)
        ref_dir = _run(AS_WRITTEN, opts, root, None)
        engine, k, world, stage = _measure(base, ref_dir)
        ref = load_run(ref_dir, k=k, max_steps=opts.steps)
        tol, _ = invariance_tolerance(ref.param_dtype, k)
        base.equal, base.update_rel_diff = True, 0.0
        results = [base]
        why_not = not_applicable(engine, k, stage)
        modes = [] if why_not else candidates(engine, stage)[1:]
        if opts.only is not None:
            modes = [m for m in modes if m.name in opts.only]
        for mode in modes:
            res = ModeResult(mode)
            results.append(res)
            try:
                out = _run(mode, opts, root, k)
                _measure(res, out)
            except CommandFailedError as exc:
                res.error = str(exc)
                continue
            cmp = compare_runs(ref, load_run(out, k=k, max_steps=opts.steps), tol)
            res.update_rel_diff = cmp.max_update_rel_diff
            res.equal = not cmp.diverged and cmp.max_update_rel_diff is not None
        if not why_not and engine in UNAPPLIABLE:
            mode, why = UNAPPLIABLE[engine]
            results.append(ModeResult(mode, error=f"not run: {why}"))
    budget = opts.memory_budget
    for r in results:
        r.fits = budget is None or r.peak_bytes is None or r.peak_bytes <= budget
    ok = [r for r in results if r.error is None and r.equal and r.fits
          and r.median_s is not None]
    best, basis = choose(ok)
    return AdviseReport(command=list(opts.command), engine=engine, k=k, world=world,
                        tolerance=tol, memory_budget=budget, results=results,
                        why_not=why_not, recommended=best, basis=basis)


def _bytes(r: ModeResult) -> float:
    return (r.grad_bytes or 0.0) + (r.param_bytes or 0.0)


def choose(ok: list[ModeResult]) -> tuple[ModeResult | None, str]:
    """The fastest eligible mode, unless the timings cannot tell the modes apart.

    A few steps on a busy machine spread widely; a mode whose median lies inside the
    fastest mode's own min-max range was not measured slower. Among such ties a mode that
    moves fewer bytes per step than the fastest wins (the fewest, then the smaller peak):
    communication saved here is time saved wherever the interconnect is the bottleneck, and
    the report says so. Equal bytes leave the fastest.
    """
    if not ok:
        return None, ""
    fastest = min(ok, key=lambda r: r.median_s or 0.0)
    top = max(fastest.seconds)
    # a tied mode wins only by moving strictly fewer bytes (equal bytes and a peak a few
    # kB apart are noise: the fastest stays)
    fewer = [r for r in ok if (r.median_s or 0.0) <= top and _bytes(r) < _bytes(fastest)]
    if not fewer:
        return fastest, "fastest median"
    best = min(fewer, key=lambda r: (_bytes(r), r.peak_bytes or 0, r.median_s or 0.0))
    return best, (f"its median time is within the fastest mode's spread ({fastest.mode.name}: "
                  f"{min(fastest.seconds):.3g}-{top:.3g} s), so the timings do not separate "
                  f"them; it moves the fewest bytes per step ({_bytes(best):.3g} B against "
                  f"{_bytes(fastest):.3g} B)")
