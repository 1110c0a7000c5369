"""``accumguard invariance``: loading one run's recording (the observation layer's
``rank-<R>.jsonl`` step records and ``updates-rank-<R>.pt`` update lists) into a
:class:`RunRecord`. Pure file parsing, testable on synthetic records."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accumguard.core.errors import ConfigError
from accumguard.core.window import StepRecord

__all__ = ["RunRecord", "StepRow", "load_run"]

_RANK_FILE = re.compile(r"^rank-(\d+)\.jsonl$")
_UPDATES_FILE = "updates-rank-{rank}.pt"


@dataclass(frozen=True)
class StepRow:
    """One optimizer step of one run: every rank's window record of it, by rank."""

    ranks: tuple[StepRecord, ...]

    @property
    def index(self) -> int:
        """The step's index (0-based, as recorded; rank 0's)."""
        return self.ranks[0].step

    @property
    def window_loss(self) -> float | None:
        """The window's loss summed over ranks; None if any rank did not know it."""
        losses = [r.window_loss for r in self.ranks]
        numbers = [float(x) for x in losses if isinstance(x, (int, float))]
        return float(sum(numbers)) if len(numbers) == len(losses) else None

    @property
    def backwards(self) -> list[int]:
        """Backward passes of the window, per rank."""
        return [r.backwards for r in self.ranks]

    @property
    def applied(self) -> list[bool]:
        """Whether the step changed the parameters, per rank."""
        return [r.applied for r in self.ranks]


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
    steps: list[StepRow] = field(default_factory=list)
    # updates[rank][step index] = {param name: float64 tensor}; missing step = not applied
    updates: list[dict[int, dict[str, Any]]] = field(default_factory=list)
    param_dtype: str | None = None
    notes: list[str] = field(default_factory=list)
    #: the least precise compute dtype recorded (bf16 parameters, autocast, FSDP2
    #: param_dtype, DeepSpeed's model dtype); None: not recorded (fp32 assumed)
    compute_dtype: str | None = None
    #: where the gradient was summed in bf16/fp16 over a window (the F12 facts), once each
    low_accumulation: list[str] = field(default_factory=list)
    #: step index -> norm of the parameters the step updated, over the ranks
    param_norms: dict[int, float] = field(default_factory=dict)
    #: what makes the script not K-invariant by construction (BatchNorm in train mode,
    #: in-batch negatives), noted by the probes of observe.invariance_construction
    construction: list[str] = field(default_factory=list)

    @property
    def has_updates(self) -> bool:
        return any(self.updates)

    def summary(self) -> dict[str, Any]:
        return {"k": self.k, "micro_batch": self.micro_batch, "command": self.command,
                "exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3),
                "world_size": self.world_size, "steps_recorded": len(self.steps),
                "param_dtype": self.param_dtype, "compute_dtype": self.compute_dtype,
                "low_precision_accumulation": self.low_accumulation,
                "not_invariant_by_construction": self.construction,
                "observe_dir": str(self.observe_dir),
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
        run.steps.append(StepRow(tuple(_step(per_rank[r][i], i) for r, _ in files)))
    run.updates = [_load_updates(observe_dir, rank, per_rank[rank][:n], run.notes)
                   for rank, _ in files]
    _precision_facts(run, [per_rank[r][:n] for r, _ in files])
    run.construction = _construction(observe_dir)
    return run


def _step(line: dict[str, Any], i: int) -> StepRecord:
    """A rank's step line as a window record (a line without a step index is the i-th)."""
    return StepRecord.from_dict({"step": i, **line,
                                 "backwards": int(line.get("backwards", 0) or 0)})


_LOW = ("bfloat16", "float16")
_ORDER = ("float16", "bfloat16", "float32", "float64")


def _precision_facts(run: RunRecord, ranks: list[list[dict[str, Any]]]) -> None:
    """The compute dtype, the low-precision sums and the parameter norms of the steps."""
    computes: set[str] = set()
    norms: dict[int, float] = {}
    for recs in ranks:
        for r in recs:
            raw = r.get("precision")
            prec: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if isinstance(prec.get("compute"), str):
                computes.add(prec["compute"])
            for text in _low_sums(r, prec):
                if text not in run.low_accumulation:
                    run.low_accumulation.append(text)
            norm = r.get("param_norm")
            if isinstance(norm, (int, float)):
                i = int(r.get("step", 0))
                norms[i] = norms.get(i, 0.0) + float(norm) ** 2
    known = [d for d in _ORDER if d in computes]
    run.compute_dtype = known[0] if known else None
    run.param_norms = {i: v ** 0.5 for i, v in norms.items()}


def _low_sums(r: dict[str, Any], prec: dict[str, Any]) -> list[str]:
    """Where this step's gradient was summed in bf16/fp16 over its backwards (as F12)."""
    out = []
    ds, fsdp, mg = prec.get("deepspeed"), prec.get("fsdp"), prec.get("model_grad")
    if isinstance(ds, dict) and ds.get("accum") in _LOW:
        out.append(f"DeepSpeed gradient_accumulation_dtype {ds['accum']}")
    if isinstance(fsdp, dict) and fsdp.get("deferred") in _LOW \
            and False in (r.get("sync_micros") or []):
        out.append(f"FSDP2 reduce_dtype {fsdp['deferred']} (sync off between micro-steps)")
    if isinstance(mg, dict) and mg.get("in_place") and mg.get("dtype") in _LOW:
        out.append(f"the model's {mg['dtype']} .grad behind fp32 master weights")
    cons = r.get("conservation")
    if (r.get("param_dtype") in _LOW and r.get("source", "torch") == "torch"
            and isinstance(cons, dict) and float(cons.get("wiped", 1.0)) <= 0.0
            and int(r.get("backwards", 0)) > 1):
        out.append(f"the {r['param_dtype']} .grad of the stepped parameters")
    return out


def _construction(observe_dir: Path) -> list[str]:
    """The causes the invariance probes noted on any rank (one line each)."""
    seen: list[str] = []
    for path in sorted(observe_dir.glob("construction-rank-*.json")):
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        seen += [str(x) for x in items if isinstance(x, str) and str(x) not in seen]
    return seen


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


