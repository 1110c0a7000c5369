"""What a finding, a run's recording, a resolved K and a window of step records are: the
types and helpers every per-window rule of :mod:`accumguard.observe.rules` and
:mod:`._weight_rules` shares (pure Python; :mod:`.rules` re-exports the public names)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from accumguard.core.taxonomy import fix_for, title

__all__ = ["NUMBERING", "DeclaredK", "Finding", "KResolution", "RunRecording", "windows"]

#: One numbering in every output of ``watch`` and ``invariance`` (findings, tables, JSON):
#: optimizer steps and micro-steps count from 1. (The raw recording counts from 0.)
NUMBERING = "1-based: step 1 is the first optimizer step, micro-step 1 the first backward " \
            "of its window"


@dataclass(frozen=True)
class Finding:
    """One finding; ``step`` and ``micro`` are 1-based (:data:`NUMBERING`)."""

    cls: str
    severity: str  # "error" | "note"
    rank: int | None
    step: int | None
    micro: int | None
    evidence: str
    fix: str
    title: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mk(cls: str, severity: str, rank: int | None, step: int | None, micro: int | None,
        evidence: str, *, title_: str | None = None, fix: str | None = None) -> Finding:
    """``step``/``micro``: the recording's 0-based indices, shown 1-based. ``title_`` and
    ``fix``: this finding's own words (a measured cost in the title) instead of the class's."""
    return Finding(cls, severity, rank, None if step is None else step + 1,
                   None if micro is None else micro + 1, evidence,
                   fix_for(cls) if fix is None else fix, title(cls) if title_ is None else title_)


def _n(step: int) -> int:
    """A recorded (0-based) step index as the user sees it."""
    return int(step) + 1


def windows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Public name of :func:`_windows` (applied steps, no-op steps folded in)."""
    return _windows(steps)


def _windows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Applied steps with the backward passes of preceding no-op steps folded in (a step
    whose gradients were all None changes nothing: the window goes on). A step a GradScaler
    skipped (``discarded``) ends its window with nothing carried: it is left out."""
    out = []
    carry = 0
    for s in steps:
        if s.get("discarded"):
            carry = 0
            continue
        if not s.get("applied", True):
            carry += int(s["backwards"])
            continue
        w = dict(s)
        w["window"] = int(s["backwards"]) + carry
        if not carry:
            per = _backwards_per_micro(s)
            if per > 1:  # several losses of one forward, each with its own backward
                w["window"] = int(s["backwards"]) // per
                w["backwards_per_micro"] = per
        carry = 0
        out.append(w)
    return out


def _backwards_per_micro(s: dict[str, Any]) -> int:
    """Backward passes per micro-step when every micro-step runs the same number b > 1 of
    them on one forward (an actor and a critic loss, each with its own backward): the
    watched forwards before each backward are ``[f, 0, .., 0] * K`` with f > 0 and b - 1
    zeros. 1 otherwise (one backward per micro-step, or a pattern that is not regular)."""
    fw = s.get("forwards") or []
    if len(fw) < 2 or len(fw) != int(s.get("backwards", 0)) or not fw[0]:
        return 1
    heads = [i for i, f in enumerate(fw) if f]
    per = len(fw) // len(heads)
    if per < 2 or per * len(heads) != len(fw) or heads != list(range(0, len(fw), per)):
        return 1
    return per


class DeclaredK(Protocol):
    """A K the script's source declares (``runtime.watch_declared.DeclaredK`` is one)."""

    @property
    def value(self) -> int | None: ...

    @property
    def divides_loss(self) -> bool: ...

    @property
    def where(self) -> str: ...

    def describe(self) -> str: ...


@dataclass
class RunRecording:
    """Everything the ranks wrote: ``steps[rank]`` (step records), engine info, ends, and
    ``failures[rank]``: accumguard's own failure on that rank (observation off from there;
    :func:`~accumguard.observe.rules.load_recordings` keeps only the steps every rank
    observed before the first one, so no rule judges a window half seen)."""

    steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    schedulers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    engine: dict[int, dict[str, Any]] = field(default_factory=dict)
    end: dict[int, dict[str, Any]] = field(default_factory=dict)
    failures: dict[int, dict[str, Any]] = field(default_factory=dict)
    world: int = 1
    #: optimizer steps observed on every rank before accumguard failed (None: no failure)
    observed_steps: int | None = None
    #: recordings left out: processes started by a recorded process (a script's subprocess)
    children: int = 0

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.steps) | set(self.end))


@dataclass(frozen=True)
class KResolution:
    """K for the analysis, where it came from, and how much it can be trusted."""

    k: int | None
    source: str
    strength: str  # "flag" | "runtime" | "script" | "inferred" | "none"
    script: DeclaredK | None = None

    @property
    def declared(self) -> bool:
        return self.strength in ("flag", "runtime", "script")
