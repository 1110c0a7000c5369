"""``accumguard invariance``: the user's own script, run once per K at one effective batch.

The check people run by hand when they suspect accumulation: train the same
script with K = 1 and K = 4 (micro-batch B and B/4), same seeds, same data
order, and compare step by step. With exact accumulation the two runs are the
same training up to floating-point rounding; a loss normalised per micro-batch
(F5), a scheduler stepped per micro-step (F4), a boundary reset (F2/F3) ... all
show as a different *update* from the first optimizer step on.

What is compared, per optimizer step (numbered from 1 for the user):

* the window loss as the script computed it: the sum of ``float(loss)`` over
  the backward calls of the step and over the ranks, relative difference to
  the reference K (the first of ``ks``);
* the parameter update Δθ = θ_after − θ_before, as
  ``||Δθ_K − Δθ_ref|| / ||Δθ_ref||`` over all parameters and ranks (each rank's
  local shard compared with the same rank's shard: ZeRO/FSDP shards and DDP
  replicas alike).

The verdict rests on the update, which is what training is: a script that
logs ``K ×`` the loss but steps identically is not diverged (a note says so).
The loss decides only for steps whose update was not recorded.

The recording comes from the one observation layer (:mod:`accumguard.observe`)
injected into every process of the command: ``rank-<R>.jsonl`` step records and
``updates-rank-<R>.pt`` update lists in one directory per K. Parsing and
comparing those files is pure (testable on synthetic records);
:func:`run_invariance` adds the child processes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from accumguard.core.errors import AccumguardError, ConfigError

__all__ = [
    "InvarianceOptions",
    "RunRecord",
    "StepRecord",
    "StepComparison",
    "KComparison",
    "InvarianceReport",
    "CommandFailedError",
    "parse_ks",
    "micro_batch",
    "expand_command",
    "check_command",
    "invariance_tolerance",
    "load_run",
    "compare_runs",
    "build_report",
    "run_invariance",
    "watch_findings",
    "JSON_VERSION",
]

JSON_VERSION = 1

PLACEHOLDER_K = "{K}"
PLACEHOLDER_MB = "{MB}"
ENV_K = "ACCUMGUARD_K"
ENV_MB = "ACCUMGUARD_MICRO_BATCH"
ENV_BATCH = "ACCUMGUARD_BATCH"
ENV_SEED = "ACCUMGUARD_SEED"
ENV_NO_DROPOUT = "ACCUMGUARD_NO_DROPOUT"

# fp32: two fp32 runs that add the same numbers in different orders (K partial sums,
# the ranks' reduction) each sit within a few 1e-7 of the exact update; over a few
# steps the difference compounds through the weights. 1e-4 (about 800 fp32 units of
# roundoff) leaves that headroom while every accumulation bug we know of moves the
# update by 1e-2 or more.
FP32_TOLERANCE = 1e-4

_RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")
_UPDATES_FILE = "updates-rank-{rank}.pt"


class CommandFailedError(AccumguardError, RuntimeError):
    """The user's command failed, was killed, timed out or never stepped an optimizer."""

    def __init__(self, message: str, *, k: int, exit_code: int | None) -> None:
        super().__init__(message)
        self.k = k
        self.exit_code = exit_code


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True, kw_only=True)
class InvarianceOptions:
    """What to run and how to judge it. Validated at construction."""

    command: tuple[str, ...]
    ks: tuple[int, ...] = (1, 4)
    steps: int = 3
    batch: int | None = None  # per-rank effective batch; MB = batch / K
    no_dropout: bool = False
    tolerance: float | None = None  # default: from the parameters' dtype
    timeout: float = 900.0  # per run, seconds
    seed: int = 0
    workdir: Path | None = None  # where the per-K recordings go (default: a temp dir)

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no command given; put it after `--`, e.g. "
                              "accumguard invariance --ks 1,4 -- python train.py --accum {K}")
        if len(self.ks) < 2:
            raise ConfigError(f"--ks {','.join(map(str, self.ks))} names {len(self.ks)} K; "
                              "give at least two, e.g. --ks 1,4 (the first is the reference)")
        if len(set(self.ks)) != len(self.ks):
            raise ConfigError(f"--ks {','.join(map(str, self.ks))} repeats a K; "
                              "give distinct values, e.g. --ks 1,4")
        for k in self.ks:
            if not isinstance(k, int) or k < 1:
                raise ConfigError(f"K={k!r} in --ks must be a positive integer")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"--steps ({self.steps!r}) must be a positive integer: the number "
                              "of optimizer steps each run makes")
        if self.batch is not None:
            for k in self.ks:
                micro_batch(self.batch, k)
        if self.tolerance is not None and not (self.tolerance > 0):
            raise ConfigError(f"--tolerance ({self.tolerance!r}) must be positive")
        if not (self.timeout > 0):
            raise ConfigError(f"--timeout ({self.timeout!r}) must be positive (seconds per run)")


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,4"`` → ``(1, 4)``, with a message that shows the expected form."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--ks {text!r} must be comma-separated positive integers, "
                          "e.g. --ks 1,4") from None
    if not ks:
        raise ConfigError(f"--ks {text!r} selects no K; e.g. --ks 1,4")
    return ks


def micro_batch(batch: int, k: int) -> int:
    """The micro-batch that keeps the per-rank effective batch ``batch`` at ``k`` micro-steps."""
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--batch ({batch!r}) must be a positive integer: the per-rank "
                          "effective batch (samples per optimizer step on one rank)")
    if batch % k:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise ConfigError(f"--batch {batch} is not divisible by K={k}: the micro-batch would be "
                          f"{batch / k:g} samples. Pick K among the divisors of {batch} "
                          f"({', '.join(map(str, divisors))}) or a batch that is a multiple of "
                          f"every K")
    return batch // k


def expand_command(command: Sequence[str], k: int, mb: int | None) -> list[str]:
    """Replace ``{K}`` and ``{MB}`` in every argument (also inside ``--x={K}``)."""
    out = []
    for arg in command:
        if PLACEHOLDER_MB in arg and mb is None:
            raise ConfigError(f"the command uses {PLACEHOLDER_MB} in {arg!r} but no --batch was "
                              "given: pass --batch B (the per-rank effective batch) so that "
                              "MB = B / K can be computed")
        arg = arg.replace(PLACEHOLDER_K, str(k))
        if mb is not None:
            arg = arg.replace(PLACEHOLDER_MB, str(mb))
        out.append(arg)
    return out


def _mentions_env(command: Sequence[str]) -> bool | None:
    """Whether a script file named in the command reads ACCUMGUARD_K / _MICRO_BATCH.

    ``None`` when no readable ``.py`` file is named (``python -m pkg``, a shell
    wrapper ...): then nobody can tell."""
    seen_file = False
    for arg in command:
        path = Path(arg)
        if path.suffix not in (".py", ".sh") or not path.is_file():
            continue
        seen_file = True
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8", errors="replace")
            if ENV_K in text or ENV_MB in text:
                return True
    return False if seen_file else None


def check_command(command: Sequence[str], *, batch: int | None) -> list[str]:
    """Refuse a command that cannot vary K, or cannot start; return warnings to print.

    Every K would run the same training (and trivially agree) if the command
    neither has a ``{K}``/``{MB}`` placeholder nor reads the environment
    variables: that is an error when the named script visibly does not read
    them, a warning when no script file is visible.
    """
    notes: list[str] = []
    exe = command[0]
    if shutil.which(exe) is None:
        where = "is not a file" if os.sep in exe else "was not found on PATH"
        raise ConfigError(f"command not found: {exe!r} {where}. Put the command after `--`, "
                          "e.g. accumguard invariance --ks 1,4 -- python train.py --accum {K}")
    has_k = any(PLACEHOLDER_K in a for a in command)
    has_mb = any(PLACEHOLDER_MB in a for a in command)
    if has_mb and batch is None:
        raise ConfigError(f"the command uses {PLACEHOLDER_MB} but no --batch was given: pass "
                          "--batch B (the per-rank effective batch); MB = B / K")
    if not has_k and not has_mb:
        reads = _mentions_env(command)
        hint = (f"put {PLACEHOLDER_K} (accumulation steps) and {PLACEHOLDER_MB} (micro-batch, "
                f"with --batch B) where the script takes them, e.g. -- torchrun train.py "
                f"--gradient_accumulation_steps {PLACEHOLDER_K} --micro_batch_size "
                f"{PLACEHOLDER_MB}, or read the environment variables {ENV_K} and {ENV_MB} in "
                "the script")
        if reads is False:
            raise ConfigError(f"the command has no {PLACEHOLDER_K} or {PLACEHOLDER_MB} "
                              f"placeholder and the script does not read {ENV_K} or {ENV_MB}: "
                              f"every K would run the same training. {hint}")
        if reads is None:
            notes.append(f"the command has no {PLACEHOLDER_K}/{PLACEHOLDER_MB} placeholder; "
                         f"assuming it reads {ENV_K}/{ENV_MB} from the environment (otherwise "
                         f"every K runs the same training). {hint}")
    elif has_k and not has_mb and batch is None:
        notes.append(f"the command sets K ({PLACEHOLDER_K}) but not the micro-batch "
                     f"({PLACEHOLDER_MB}): the script must keep the effective batch fixed "
                     "itself, or the runs compare different batch sizes")
    return notes


def invariance_tolerance(dtype: str | None, k_max: int) -> tuple[float, str]:
    """Tolerance on the relative update/loss difference between two K, from the dtype.

    fp32/fp64: :data:`FP32_TOLERANCE`. bf16/fp16: each run's gradient carries
    about (K + 2) roundings of unit u (K accumulations, the sync, the optimizer);
    two runs differ by up to twice that, so 2·(K_max + 2)·u.
    """
    name = (dtype or "").replace("torch.", "")
    if name in ("bfloat16", "bf16"):
        return 2 * (k_max + 2) * 2.0 ** -8, f"bf16 parameters: 2·(K+2)·u, u=2^-8, K={k_max}"
    if name in ("float16", "fp16", "half"):
        return 2 * (k_max + 2) * 2.0 ** -11, f"fp16 parameters: 2·(K+2)·u, u=2^-11, K={k_max}"
    if name in ("float64", "double"):
        return FP32_TOLERANCE, "float64 parameters: 1e-4 (the fp32 bound; fp64 sits far below)"
    if name in ("float32", "float"):
        return FP32_TOLERANCE, "float32 parameters: 1e-4, fp32 sums in a different order"
    return FP32_TOLERANCE, ("parameter dtype not recorded, assumed float32: 1e-4; pass "
                            "--tolerance for bf16/fp16 training")


# ----------------------------------------------------------------------------- records
@dataclass
class StepRecord:
    """One optimizer step of one run, all ranks together (index 0-based, as recorded)."""

    index: int
    window_loss: float | None  # summed over ranks; None if any rank did not know it
    backwards: list[int]  # per rank
    applied: list[bool]  # per rank


@dataclass
class RunRecord:
    """What one run (one K) recorded."""

    k: int
    micro_batch: int | None
    command: list[str]
    observe_dir: Path
    exit_code: int | None = None
    elapsed_s: float = 0.0
    world_size: int = 0
    steps: list[StepRecord] = field(default_factory=list)
    # updates[rank][step index] = {param name: float64 tensor}; missing step = not applied
    updates: list[dict[int, dict[str, Any]]] = field(default_factory=list)
    param_dtype: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def has_updates(self) -> bool:
        return any(self.updates)

    def summary(self) -> dict[str, Any]:
        return {"k": self.k, "micro_batch": self.micro_batch, "command": self.command,
                "exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3),
                "world_size": self.world_size, "steps_recorded": len(self.steps),
                "param_dtype": self.param_dtype, "observe_dir": str(self.observe_dir),
                "window_losses": [s.window_loss for s in self.steps],
                "backwards_per_rank": [s.backwards for s in self.steps],
                "notes": self.notes}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            # A rank killed mid-write leaves a torn last line; anything else is corrupt.
            if n == len(path.read_text(encoding="utf-8").splitlines()):
                continue
            raise ConfigError(f"{path}:{n}: not a JSON line: {line[:80]!r}") from None
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _dtype_of(rec: dict[str, Any]) -> str | None:
    for key in ("param_dtype", "dtype", "compute_dtype"):
        v = rec.get(key)
        if isinstance(v, str):
            return v.replace("torch.", "")
        if isinstance(v, (list, tuple)) and v:  # several dtypes: the least precise decides
            order = ("bfloat16", "float16", "float32", "float64")
            names = [str(x).replace("torch.", "") for x in v]
            known = [n for n in order if n in names]
            return known[0] if known else names[0]
    return None


def load_run(observe_dir: Path, *, k: int, micro_batch: int | None = None,
             command: Sequence[str] = (), max_steps: int | None = None) -> RunRecord:
    """Read one run's ``rank-<R>.jsonl`` (and ``updates-rank-<R>.pt``) into a :class:`RunRecord`.

    Ranks are aligned by step index; a rank with fewer steps than the others
    truncates the run (noted). Updates are listed per *applied* step, so the
    i-th update belongs to the i-th step record with ``applied`` true.
    """
    observe_dir = Path(observe_dir)
    run = RunRecord(k=k, micro_batch=micro_batch, command=list(command), observe_dir=observe_dir)
    files = sorted(((int(m.group(1)), p) for p in observe_dir.glob("rank-*.jsonl")
                    if (m := _RANK_FILE.match(p.name))), key=lambda t: t[0])
    if not files:
        return run
    ranks = [r for r, _ in files]
    if ranks != list(range(len(ranks))):
        run.notes.append(f"recordings for ranks {ranks}: some ranks left no record")
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank, path in files:
        recs = [r for r in _read_jsonl(path) if r.get("kind") == "step"]
        recs.sort(key=lambda r: int(r.get("step", 0)))
        for r in _read_jsonl(path):
            run.param_dtype = run.param_dtype or _dtype_of(r)
        per_rank[rank] = recs
    run.world_size = len(files)
    counts = {r: len(v) for r, v in per_rank.items()}
    n = min(counts.values())
    if len(set(counts.values())) > 1:
        run.notes.append(f"ranks recorded different numbers of optimizer steps {counts}; "
                         f"comparing the first {n}")
    if max_steps is not None:
        n = min(n, max_steps)
    for i in range(n):
        recs = [per_rank[r][i] for r, _ in files]
        losses = [r.get("window_loss") for r in recs]
        numbers = [float(x) for x in losses if isinstance(x, (int, float))]
        loss = float(sum(numbers)) if len(numbers) == len(losses) else None
        run.steps.append(StepRecord(index=int(recs[0].get("step", i)), window_loss=loss,
                                    backwards=[int(r.get("backwards", 0) or 0) for r in recs],
                                    applied=[bool(r.get("applied", True)) for r in recs]))
    run.updates = [_load_updates(observe_dir, rank, per_rank[rank][:n], run.notes)
                   for rank, _ in files]
    return run


def _load_updates(observe_dir: Path, rank: int, recs: list[dict[str, Any]],
                  notes: list[str]) -> dict[int, dict[str, Any]]:
    path = observe_dir / _UPDATES_FILE.format(rank=rank)
    if not path.exists():
        return {}
    import torch

    try:
        updates = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a torn file from a killed rank
        notes.append(f"rank {rank}: cannot read {path.name} ({type(exc).__name__}: {exc}); "
                     "comparing losses only")
        return {}
    if not isinstance(updates, list):
        notes.append(f"rank {rank}: {path.name} holds {type(updates).__name__}, expected a list "
                     "of {name: update} dicts; comparing losses only")
        return {}
    applied = [int(r.get("step", i)) for i, r in enumerate(recs) if r.get("applied", True)]
    if len(updates) < len(applied):
        notes.append(f"rank {rank}: {len(updates)} recorded updates for {len(applied)} applied "
                     "steps; steps without an update are compared by loss")
    return {step: {str(name): t for name, t in upd.items()}
            for step, upd in zip(applied, updates, strict=False) if isinstance(upd, dict)}


# ----------------------------------------------------------------------------- comparison
@dataclass
class StepComparison:
    """One optimizer step of run K against the reference run."""

    step: int  # 1-based: the first optimizer step is step 1
    loss_ref: float | None
    loss: float | None
    loss_rel_diff: float | None
    update_rel_diff: float | None  # None: not recorded for this step
    update_norm_ref: float | None
    backwards_ref: list[int]
    backwards: list[int]
    diverged: bool = False
    decided_by: str = ""  # "update", "loss" or ""

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in self.__dict__.items()}


@dataclass
class KComparison:
    """Run K against the reference K, step by step."""

    k: int
    k_ref: int
    steps: list[StepComparison]
    first_divergent_step: int | None
    max_update_rel_diff: float | None
    max_loss_rel_diff: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return self.first_divergent_step is not None

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "k_ref": self.k_ref, "diverged": self.diverged,
                "first_divergent_step": self.first_divergent_step,
                "max_update_rel_diff": _json_float(self.max_update_rel_diff),
                "max_loss_rel_diff": _json_float(self.max_loss_rel_diff),
                "notes": self.notes, "steps": [s.to_dict() for s in self.steps]}


def _json_float(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    den = abs(b)
    return abs(a - b) / den if den > 0 else math.inf


def _update_diff(ref: RunRecord, run: RunRecord, index: int) -> tuple[float | None, float | None,
                                                                      list[str]]:
    """``||Δθ_K − Δθ_ref|| / ||Δθ_ref||`` over every rank's recorded shard for one step."""
    import torch

    num = den = 0.0
    seen = False
    problems: list[str] = []
    for rank in range(min(len(ref.updates), len(run.updates))):
        a = ref.updates[rank].get(index)
        b = run.updates[rank].get(index)
        if a is None and b is None:
            continue
        seen = True
        a = a or {}
        b = b or {}
        for name in sorted(set(a) | set(b)):
            ta, tb = a.get(name), b.get(name)
            if ta is not None and tb is not None and ta.shape != tb.shape:
                problems.append(f"rank {rank}: parameter {name!r} has shape {tuple(tb.shape)} "
                                f"at K={run.k} but {tuple(ta.shape)} at K={ref.k}")
                continue
            if ta is None or tb is None:
                problems.append(f"rank {rank}: parameter {name!r} updated only at "
                                f"K={ref.k if tb is None else run.k}")
            like = ta if ta is not None else tb
            assert like is not None  # the name came from a or b
            za = ta.double() if ta is not None else torch.zeros_like(like, dtype=torch.float64)
            zb = tb.double() if tb is not None else torch.zeros_like(like, dtype=torch.float64)
            num += float(torch.sum((zb - za) ** 2))
            den += float(torch.sum(za ** 2))
    if not seen:
        return None, None, problems
    nref = math.sqrt(den)
    if num == 0.0:
        return 0.0, nref, problems
    return (math.sqrt(num) / nref if nref > 0 else math.inf), nref, problems


def compare_runs(ref: RunRecord, run: RunRecord, tolerance: float) -> KComparison:
    """Compare ``run`` with ``ref`` step by step; a step diverges when its update (or, when no
    update was recorded, its window loss) differs by more than ``tolerance``."""
    n = min(len(ref.steps), len(run.steps))
    notes: list[str] = []
    if len(ref.steps) != len(run.steps):
        notes.append(f"K={ref.k} recorded {len(ref.steps)} optimizer steps, K={run.k} "
                     f"{len(run.steps)}: comparing the first {n}")
    if ref.world_size != run.world_size:
        notes.append(f"K={ref.k} ran on {ref.world_size} rank(s), K={run.k} on "
                     f"{run.world_size}: the effective batch differs unless the script "
                     "compensates")
    if not (ref.has_updates and run.has_updates):
        notes.append("parameter updates were not recorded for "
                     + ("either run" if not (ref.has_updates or run.has_updates)
                        else f"K={run.k if ref.has_updates else ref.k}")
                     + ": the verdict rests on the window loss only")
    steps: list[StepComparison] = []
    first: int | None = None
    loss_only_steps: list[int] = []
    shown_problems = False
    for i in range(n):
        a, b = ref.steps[i], run.steps[i]
        loss_rel = (None if a.window_loss is None or b.window_loss is None
                    else _rel(b.window_loss, a.window_loss))
        upd, nref, problems = _update_diff(ref, run, a.index) if b.index == a.index else (
            None, None, [f"step index {b.index} at K={run.k} vs {a.index} at K={ref.k}"])
        if problems and not shown_problems:
            notes += problems[:3]
            shown_problems = True
        sc = StepComparison(step=i + 1, loss_ref=a.window_loss, loss=b.window_loss,
                            loss_rel_diff=loss_rel, update_rel_diff=upd, update_norm_ref=nref,
                            backwards_ref=a.backwards, backwards=b.backwards)
        if upd is not None:
            sc.decided_by = "update"
            sc.diverged = not (upd <= tolerance)
            if not sc.diverged and loss_rel is not None and not (loss_rel <= tolerance):
                loss_only_steps.append(i + 1)
        elif loss_rel is not None:
            sc.decided_by = "loss"
            sc.diverged = not (loss_rel <= tolerance)
        if sc.diverged and first is None:
            first = i + 1
        steps.append(sc)
    if loss_only_steps:
        notes.append(f"the window loss as logged differs at step(s) {_ranges(loss_only_steps)} "
                     "but the parameter updates agree: the script reports its loss on a "
                     "different scale per K (e.g. the loss of the last micro-batch, or not "
                     "divided by K); the training itself is the same")
    if n == 0:
        notes.append("no optimizer step to compare")
    _backward_notes(ref, run, n, notes)
    updates = [s.update_rel_diff for s in steps if s.update_rel_diff is not None]
    losses = [s.loss_rel_diff for s in steps if s.loss_rel_diff is not None]
    return KComparison(k=run.k, k_ref=ref.k, steps=steps, first_divergent_step=first,
                       max_update_rel_diff=max(updates) if updates else None,
                       max_loss_rel_diff=max(losses) if losses else None, notes=notes)


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:6])) + (" ..." if len(steps) > 6 else "")


def _backward_notes(ref: RunRecord, run: RunRecord, n: int, notes: list[str]) -> None:
    """Backward passes per step should scale with K (K per rank per step): say so if not."""
    for who in (ref, run):
        odd = [(i + 1, s.backwards) for i, s in enumerate(who.steps[:n])
               if any(b != who.k for b in s.backwards)]
        if odd:
            step, bw = odd[0]
            notes.append(f"K={who.k}: step {step} saw {bw} backward pass(es) per rank, expected "
                         f"{who.k} (one per micro-batch); {len(odd)} of {n} steps differ. The "
                         "script may not take K from the placeholder, or steps on micro-steps")


# ----------------------------------------------------------------------------- report
@dataclass
class InvarianceReport:
    """Everything one ``accumguard invariance`` call found."""

    command: list[str]
    ks: tuple[int, ...]
    batch: int | None
    steps: int
    tolerance: float
    tolerance_reason: str
    runs: list[RunRecord]
    comparisons: list[KComparison]
    no_dropout: bool = False
    warnings: list[str] = field(default_factory=list)
    # findings of the observation layer (watch) for each run that diverged, by K
    findings: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    findings_text: dict[int, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def diverged(self) -> bool:
        return any(c.diverged for c in self.comparisons)

    @property
    def first_divergent_step(self) -> int | None:
        steps = [c.first_divergent_step for c in self.comparisons if c.diverged]
        return min(steps) if steps else None  # type: ignore[type-var]

    @property
    def exit_code(self) -> int:
        return 1 if self.diverged else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION, "tool": "accumguard invariance",
            "command": self.command, "ks": list(self.ks), "k_ref": self.ks[0],
            "batch": self.batch, "steps": self.steps, "no_dropout": self.no_dropout,
            "step_numbering": "1-based: step 1 is the first optimizer step",
            "tolerance": self.tolerance, "tolerance_reason": self.tolerance_reason,
            "diverged": self.diverged, "first_divergent_step": self.first_divergent_step,
            "exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3),
            "warnings": self.warnings,
            "runs": [r.summary() for r in self.runs],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "findings": {str(k): v for k, v in self.findings.items()},
        }

    def write_json(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n",
                        encoding="utf-8")
        return path


def build_report(runs: list[RunRecord], *, command: Sequence[str], batch: int | None,
                 steps: int, tolerance: float | None = None, no_dropout: bool = False,
                 warnings_: Sequence[str] = ()) -> InvarianceReport:
    """Compare every run with the first; the tolerance defaults to the recorded dtype's."""
    ks = tuple(r.k for r in runs)
    dtypes = [r.param_dtype for r in runs if r.param_dtype]
    dtype = _least_precise(dtypes)
    if tolerance is None:
        tol, reason = invariance_tolerance(dtype, max(ks))
    else:
        tol, reason = tolerance, f"--tolerance {tolerance:g} (parameters: {dtype or 'unknown'})"
    ref = runs[0]
    comps = [compare_runs(ref, r, tol) for r in runs[1:]]
    return InvarianceReport(command=list(command), ks=ks, batch=batch, steps=steps,
                            tolerance=tol, tolerance_reason=reason, runs=runs,
                            comparisons=comps, no_dropout=no_dropout, warnings=list(warnings_))


def _least_precise(dtypes: Sequence[str]) -> str | None:
    for name in ("bfloat16", "float16", "float32", "float64"):
        if name in dtypes:
            return name
    return dtypes[0] if dtypes else None


# ----------------------------------------------------------------------------- running
_HOOKS_BOOTSTRAP = Path(__file__).resolve().parent / "_invariance_bootstrap"


def _observer_env(observe_dir: Path, opts: InvarianceOptions) -> dict[str, str]:
    """The environment that makes every Python process of the command load the observer
    (recording updates, stopping after ``opts.steps`` steps) and invariance's seed/dropout
    hook, whose bootstrap the observer's bootstrap runs next (it chains)."""
    from accumguard.runtime.watch import BOOTSTRAP_DIR, observed_env

    env = observed_env(os.environ, observe_dir, record_updates=True, max_steps=opts.steps)
    parts = env.get("PYTHONPATH", "").split(os.pathsep)
    at = parts.index(str(BOOTSTRAP_DIR)) + 1 if str(BOOTSTRAP_DIR) in parts else 0
    parts.insert(at, str(_HOOKS_BOOTSTRAP))
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


def _child_env(opts: InvarianceOptions, k: int, mb: int | None, observe_dir: Path
               ) -> dict[str, str]:
    env = dict(os.environ)
    env.update(_observer_env(observe_dir, opts))
    env.update({
        ENV_K: str(k),
        ENV_SEED: str(opts.seed),
        "PYTHONHASHSEED": str(opts.seed),
        "PYTHONUNBUFFERED": "1",
    })
    if mb is not None:
        env[ENV_MB] = str(mb)
        env[ENV_BATCH] = str(opts.batch)
    else:
        env.pop(ENV_MB, None)
        env.pop(ENV_BATCH, None)
    if opts.no_dropout:
        env[ENV_NO_DROPOUT] = "1"
    else:
        env.pop(ENV_NO_DROPOUT, None)
    return env


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the child's process group (torchrun forwards it to its ranks), then SIGKILL."""
    if proc.poll() is not None:
        # The launcher is gone; its ranks may not be: the group outlives its leader.
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


class _Interrupted(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _forward_signals() -> Iterator[None]:
    """Turn SIGTERM/SIGINT into an exception, so the child's group is killed on the way out."""
    def handler(signum: int, _frame: Any) -> None:
        raise _Interrupted(signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: leave as is
                previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def _run_child(argv: list[str], env: dict[str, str], timeout: float, k: int
               ) -> tuple[int, float]:
    """Run one K's command in its own process group; stdout/stderr pass through untouched."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
    except FileNotFoundError:
        raise CommandFailedError(f"command not found: {argv[0]!r}", k=k, exit_code=127) from None
    except PermissionError:
        raise CommandFailedError(f"command not executable: {argv[0]!r}", k=k,
                                 exit_code=126) from None
    try:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CommandFailedError(
                f"K={k}: the command did not finish within {timeout:.0f} s and was killed "
                "(with every process it started). It should stop by itself after --steps "
                "optimizer steps; raise --timeout if one run is genuinely that slow",
                k=k, exit_code=None) from None
    finally:
        # Normal end, timeout or a signal to us: nothing the command started may survive.
        _kill_group(proc, grace=2.0)
    return code, time.monotonic() - t0


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def run_invariance(opts: InvarianceOptions, *, stream: TextIO | None = None,
                   findings_for: Callable[[RunRecord], tuple[list[dict[str, Any]], str]]
                   | None = None) -> InvarianceReport:
    """Run the command once per K, load the recordings, compare with the first K.

    Raises :class:`ConfigError` for bad input before anything runs, and
    :class:`CommandFailedError` when a run fails, is killed, times out or never
    steps an optimizer (its exit code in the message). ``findings_for`` maps a
    run's recording directory to the observation layer's findings (watch);
    it is called for every run that diverged.
    """
    stream = stream if stream is not None else sys.stderr
    findings_for = findings_for if findings_for is not None else watch_findings
    notes = check_command(opts.command, batch=opts.batch)
    for n in notes:  # printed now: they matter most when the run then fails
        print(f"accumguard invariance: warning: {n}", file=stream, flush=True)
    t0 = time.monotonic()
    own_tmp = None
    if opts.workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="accumguard-invariance-")
        root = Path(own_tmp.name)
    else:
        root = Path(opts.workdir)
        root.mkdir(parents=True, exist_ok=True)
    runs: list[RunRecord] = []
    try:
        with _forward_signals():
            for k in opts.ks:
                mb = micro_batch(opts.batch, k) if opts.batch is not None else None
                argv = expand_command(opts.command, k, mb)
                observe_dir = root / f"k{k}"
                if observe_dir.exists():
                    shutil.rmtree(observe_dir)
                observe_dir.mkdir(parents=True)
                print(f"accumguard invariance: K={k}" + (f", micro-batch {mb}" if mb else "")
                      + f", {opts.steps} optimizer steps: {shlex.join(argv)}", file=stream,
                      flush=True)
                code, elapsed = _run_child(argv, _child_env(opts, k, mb, observe_dir),
                                           opts.timeout, k)
                run = load_run(observe_dir, k=k, micro_batch=mb, command=argv,
                               max_steps=opts.steps)
                run.exit_code, run.elapsed_s = code, elapsed
                _check_run(run, opts)
                runs.append(run)
        report = build_report(runs, command=opts.command, batch=opts.batch, steps=opts.steps,
                              tolerance=opts.tolerance, no_dropout=opts.no_dropout,
                              warnings_=notes)
        for comp in report.comparisons:
            if comp.diverged:
                run = next(r for r in runs if r.k == comp.k)
                try:
                    found, text = findings_for(run)
                except Exception as exc:  # noqa: BLE001 - findings are an extra, not the verdict
                    report.warnings.append(f"K={comp.k}: watch findings unavailable "
                                           f"({type(exc).__name__}: {exc})")
                    continue
                report.findings[comp.k] = found
                report.findings_text[comp.k] = text
        report.elapsed_s = time.monotonic() - t0
        return report
    except _Interrupted as exc:
        name = signal.Signals(exc.signum).name
        raise KeyboardInterrupt(f"{name}: stopped; the command's processes were killed") from None
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()


def watch_findings(run: RunRecord) -> tuple[list[dict[str, Any]], str]:
    """What ``accumguard watch`` finds in one run's recording (K known: the run's own).

    Returns the findings as dicts (the observation layer's fields plus
    ``optimizer_step``, 1-based like the rest of this report) and one text line each.
    """
    from accumguard.runtime.watch_findings import analyze, load_recordings

    found, _k, _source = analyze(load_recordings(run.observe_dir), k_flag=run.k)
    out: list[dict[str, Any]] = []
    lines: list[str] = []
    for f in found:
        d = dict(f.as_dict())
        step = d.get("step")
        d["optimizer_step"] = step + 1 if isinstance(step, int) else None
        out.append(d)
        where = ", ".join(x for x in (
            f"rank {d['rank']}" if d.get("rank") is not None else "",
            f"step {d['optimizer_step']}" if d["optimizer_step"] is not None else "",
            f"micro-step {d['micro']}" if d.get("micro") is not None else "") if x)
        lines.append(f"{d.get('severity', '?')} {d.get('cls', '?')} ({d.get('title', '')})"
                     f"{' at ' + where if where else ''}: {d.get('evidence', '')}")
        if d.get("fix") and d.get("severity") == "error":
            lines.append(f"  fix: {d['fix']}")
    return out, "\n".join(lines)


def _check_run(run: RunRecord, opts: InvarianceOptions) -> None:
    code = run.exit_code
    assert code is not None
    steps = len(run.steps)
    if code != 0:
        raise CommandFailedError(
            f"K={run.k}: the command {_describe_exit(code)} after {steps} recorded optimizer "
            f"step(s): {shlex.join(run.command)}. Its output is above; fix the script (or the "
            "placeholders) and run again", k=run.k, exit_code=code)
    if run.world_size == 0:
        raise CommandFailedError(
            f"K={run.k}: the command exited with code 0 but no process of it ran a backward "
            f"pass or an optimizer step under the observation layer (nothing recorded in "
            f"{run.observe_dir}). Either the script never trains at this K (too little data "
            "for one window?), or the command does not start Python with the inherited "
            "environment (a wrapper that resets PYTHONPATH): run the Python launcher directly "
            "(python, torchrun, deepspeed, accelerate launch)", k=run.k, exit_code=0)
    if steps == 0:
        raise CommandFailedError(
            f"K={run.k}: the command exited with code 0 but never stepped an optimizer "
            f"({run.world_size} rank(s) observed, no optimizer step): nothing to compare. "
            "Does the script train for at least one optimizer step at this K "
            "(enough data for K micro-batches)?", k=run.k, exit_code=0)
    if steps < opts.steps:
        run.notes.append(f"only {steps} of {opts.steps} optimizer steps recorded (the script "
                         "ended first)")
