"""The audit's report types: what one loop was seen doing, and the verdict on it.

What a window held is the one window record of every judge,
:class:`accumguard.core.window.StepRecord` (its
:meth:`~accumguard.core.window.StepRecord.audit_counts` is the report's ``counts`` object).

These dataclasses are the seam between the observer (which fills
:class:`LoopObservation` on every rank), the comparison (which builds an
:class:`AuditReport`) and the diagnosis (which reads both and returns a
:class:`Diagnosis`). Nothing here computes; ``to_dict()`` output is JSON-safe
and follows ``audit.schema.json`` next to this module.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Literal, TypeAlias

import torch

# (the module, not the name: ``report.StepRecord`` is the old name of AuditStep, see below)
from accumguard.core import window

__all__ = ["AuditStep", "Divergence", "Tolerance", "LoopObservation",
           "Candidate", "Diagnosis", "AuditReport", "LossSource", "Precision", "Basis",
           "JsonValue", "json_object", "json_safe"]

LossSource = Literal["loop", "reference"]
# A compute / accumulation precision, declared in the AuditSetup or detected ("auto").
Precision = Literal["auto", "fp32", "bf16", "fp16"]
# What a diagnosis rests on: the whole parameter trajectory, the first gradient (low-precision
# weights), the number and placement of the optimizer steps, or the size of rounding drift.
Basis = Literal["trajectory", "gradient", "step pattern", "magnitude", "no update"]


@dataclass
class AuditStep:
    """One optimizer step of the loop under audit, compared with the reference step
    (``counts``: what the observer saw in the step's window)."""

    step: int
    update_error: float | None
    grad_error: float | None
    lr: list[float] | None
    ref_lr: list[float] | None
    loss: float | None
    ref_loss: float | None
    counts: window.StepRecord
    worst_parameter: str | None = None
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    # The bound the update error is held to at this step (see accumguard.verify.tolerance).
    update_tolerance: float | None = None
    # The bound the gradient error is held to at this step.
    grad_tolerance: float | None = None


@dataclass
class Divergence:
    """The first step whose update (or gradient) error exceeds its tolerance. Errors are
    relative to the reference's update size, so they are finite even where the reference
    does not move (an LR of 0 at step 0)."""

    step: int
    parameter: str
    max_abs_diff: float
    max_rel_diff: float
    update_error: float
    grad_error: float | None


@dataclass(frozen=True)
class Tolerance:
    """How far a correct loop may be from the fp64 reference, and why.

    ``grad`` bounds the relative gradient error. The update at step s is held to
    ``grad + floor[s] + weight_rounding · (s+1) · ‖θ_s‖ / ‖Δθ_s‖`` (the stored
    weights are re-rounded at every step; ``floor`` is the measured error of the
    reference itself run at the loop's compute precision, zero for fp32 compute).
    """

    grad: float
    weight_rounding: float
    compute: str
    accumulation: str
    params: str
    source: str
    reason: str
    floor: tuple[float, ...] = ()
    given: bool = False


@dataclass
class LoopObservation:
    """What the observer saw of one loop on one rank (picklable: sent to the parent)."""

    name: str
    initial: dict[str, torch.Tensor]
    params: list[dict[str, torch.Tensor] | None]
    grads: list[dict[str, torch.Tensor] | None]
    lrs: list[list[float]]
    records: list[window.StepRecord]  # one per optimizer step
    trailing: window.StepRecord  # the micro-steps after the last step (``optimizer_steps`` 0)
    loss_sums: list[float]
    loss_counts: list[float]
    engine: str
    engine_info: dict[str, int | float]
    outer_optimizers: list[str]
    param_dtypes: list[str]
    snapshot_failed: str | None
    notes: list[str]
    # Precision seen at the forward: "autocast bf16", "fsdp2 mixed precision bf16", ...
    compute_dtypes: list[str] = field(default_factory=list)
    # Parameter names the optimizer held that are not ctx.model's (master copies, a rebuilt
    # model): their gradients cannot be compared by name.
    foreign_params: int = 0


@dataclass
class Candidate:
    """One hypothesis (class + variant) and how well it explains the observation."""

    id: str
    variant: str
    residual: float
    scale: float = 1.0
    scale_label: str = "1"
    title: str = ""


@dataclass
class Diagnosis:
    """The best-explaining failure class, the runner-up, and the fix.

    ``explained`` is False when no hypothesis fits under ``threshold``: then
    ``bug_id`` is ``"unexplained"`` and ``closest`` names the nearest class (None
    when no hypothesis even predicts the observed number of steps). ``basis`` says
    what the finding rests on; ``residual`` is None when the finding is read from
    the step pattern or the absence of any update rather than fitted.
    """

    explained: bool
    bug_id: str
    title: str
    variant: str
    residual: float | None
    scale: float
    scale_label: str
    fix: str
    threshold: float
    runner_up: Candidate | None
    closest: Candidate | None
    basis: Basis = "trajectory"
    candidates: list[Candidate] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for a terminal or a CI log."""
        if not self.explained:
            near = ""
            if self.closest is not None and math.isfinite(self.closest.residual):
                near = (f"; closest {self.closest.id} ({self.closest.title}) residual "
                        f"{self.closest.residual:.2g}")
            elif self.basis == "step pattern":
                near = "; no known class predicts the observed number of optimizer steps"
            return f"unexplained: no known failure class fits under {self.threshold:.0e}{near}"
        scale = "" if self.scale_label == "1" else f", fitted scale {self.scale_label}"
        fit = (f"; residual {self.residual:.2g}" if self.residual is not None
               else "" if self.basis == "no update" else f"; from the {self.basis}")
        return f"{self.bug_id}: {self.title} ({self.variant}{scale}{fit})"

    def to_dict(self) -> dict[str, JsonValue]:
        return json_object(asdict(self))


@dataclass
class AuditReport:
    """Verdict of one audit. ``to_dict()`` is JSON-safe.

    ``passed`` means: same number of optimizer steps as the reference, every
    step's relative update error ≤ its ``update_tolerance`` and gradient error
    (where the gradient is observable) ≤ its ``grad_tolerance``, every gradient
    the reference has was observed, and all ranks hold the same parameters.
    ``losses`` is the per-step loss of the full effective batch as the loop saw
    it (all ranks' summed losses / their count, if the loop used
    ``ctx.loss_fn``), else the reference loss; ``loss_source`` says which.
    """

    name: str
    passed: bool
    tolerance: float
    tolerance_reason: str
    world_size: int
    accumulation_steps: int
    epochs: int
    engine: str
    param_dtype: str
    compute_dtype: str
    reference_dtype: str
    optimizer_steps: int
    reference_steps: int
    steps: list[AuditStep]
    totals: window.StepRecord
    first_divergence: Divergence | None
    failures: list[str]
    notes: list[str]
    losses: list[float]
    loss_source: LossSource
    gradients_observed: bool
    ranks_max_param_diff: float
    trailing_backward: int
    duration_s: float
    tolerance_model: Tolerance | None = None
    parameters_moved: bool = True
    diagnosis: Diagnosis | None = None
    engine_info: dict[str, int | float] = field(default_factory=dict)

    @property
    def max_update_error(self) -> float:
        errs = [s.update_error for s in self.steps if s.update_error is not None]
        return max(errs) if errs else float("nan")

    @property
    def max_grad_error(self) -> float | None:
        errs = [s.grad_error for s in self.steps if s.grad_error is not None]
        return max(errs) if errs else None

    def counts_per_step(self) -> dict[str, float]:
        """Mean of each count over the optimizer steps (what a healthy loop shows: 1 step,
        1 scheduler step, ≤1 gradient collective round, K backwards)."""
        n = max(1, len(self.steps))
        return {k: v / n for k, v in self.totals.audit_counts().items()}

    def to_dict(self) -> dict[str, JsonValue]:
        out = asdict(self)
        # a window record's counts as the report names them (``audit.schema.json``)
        out["totals"] = self.totals.audit_counts()
        for step, rec in zip(out["steps"], self.steps, strict=True):
            step["counts"] = rec.counts.audit_counts()
        out["diagnosis"] = None if self.diagnosis is None else self.diagnosis.to_dict()
        out["max_update_error"] = self.max_update_error
        out["max_grad_error"] = self.max_grad_error
        return json_object(out)


def _finite(x: float | None) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return x


#: what :func:`json_safe` makes of any object: the types ``json.dumps`` writes as they are
JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"


def json_object(d: dict[str, object]) -> dict[str, JsonValue]:
    """:func:`json_safe` of a dict with string keys (a report's ``to_dict()``)."""
    return {str(k): json_safe(v) for k, v in d.items()}


def json_safe(obj: object) -> JsonValue:
    """``obj`` with tuples as lists, non-finite floats as None, tensors as lists."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, torch.Tensor):
        return json_safe(obj.tolist())
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def _step_counts(**counts: int) -> window.StepRecord:
    """The old ``StepCounts(...)``: its keyword names are the report's count keys."""
    kw = {window.AUDIT_COUNTS[k]: v for k, v in counts.items()}
    return window.StepRecord.of_counts(0, {"optimizer_steps": 0, **kw})


_RENAMED: dict[str, tuple[object, str]] = {
    "StepCounts": (_step_counts, "accumguard.core.window.StepRecord (its audit_counts() are the "
                                 "report's counts; sum_records() adds them up)"),
    "StepRecord": (AuditStep, "accumguard.verify.report.AuditStep"),
}


def __getattr__(name: str) -> object:
    """Names the audit's report types had before the one window record: they work for one
    release, with a DeprecationWarning naming the new one."""
    if name in _RENAMED:
        new, where = _RENAMED[name]
        warnings.warn(f"accumguard.verify.report.{name} is now {where} (the old name goes away "
                      "in the next release)", DeprecationWarning, stacklevel=2)
        return new
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
