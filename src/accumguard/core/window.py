"""The one window record: what happened between two optimizer steps, as every judge reads it.

A window is the run of backward passes that one optimizer step consumes. Three producers
tally it, each from its own vantage point, into the same :class:`StepRecord`:

* the observation layer (:mod:`accumguard.observe`), per optimizer step, for ``watch``,
  the framework callbacks and the rules of :mod:`accumguard.observe.rules`; ``watch``
  writes :meth:`StepRecord.as_dict` as one line of ``rank-<R>.jsonl`` and the judges read
  it back with :meth:`StepRecord.from_dict` (the line's keys are a stable format:
  ``watch --report DIR`` reads other nodes' files, written by other versions);
* the runtime guard (:mod:`accumguard.runtime.guard`), per closed window (``index``,
  ``backward_passes``, ``sync_rounds`` name its counts as the guard reports them);
* the audit (:mod:`accumguard.verify.audit`), per optimizer step of the loop under audit
  (:meth:`StepRecord.audit_counts` is its report's ``counts`` object).

A producer fills the fields it can see and leaves the others at their defaults (0, empty,
None: not seen). Pure Python, no torch: ``watch`` judges a recording without importing it;
the tensors of ``updates`` are never written to the JSON line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotation only: this module runs without torch
    import torch

__all__ = ["AUDIT_COUNTS", "Conservation", "StepRecord", "sum_records"]


@dataclass(frozen=True)
class Conservation:
    """The verdict for one optimizer step: did the optimizer receive the sum of the window's
    backward contributions (:func:`accumguard.observe._checksum.conservation` computes it).

    ``wiped``: relative size of the gradient removed between the window's backward
    passes; ``stale``: relative size of gradient present before the window's first
    backward (left from the previous step); ``received``: relative difference of
    what the optimizer received from the sum of the contributions (up to a common
    scale, which clipping and unscaling apply). ``ok`` is the verdict; ``reason`` says why
    it failed ("wiped", "stale"), or "returned" for a window whose gradient left ``.grad``
    between the backwards and came back at the step up to a rounding difference (a buffer
    of the loop's own): conserved, with that difference in ``received``.
    """

    params: int
    wiped: float
    stale: float
    received: float
    ok: bool
    reason: str
    first_wipe: int | None = None  # first backward (0-based) that began on a wiped gradient
    #: every backward (0-based) that began on a changed gradient (empty for "stale"), and,
    #: for a "wiped" verdict only (else 0), the share of the window's gradient by absolute
    #: mass (the ``sum(|g|)`` column) removed there: ``wiped`` is of the linear checksums,
    #: whose signed terms cancel, so it understates what was lost
    wipes: tuple[int, ...] = ()
    lost: float = 0.0
    #: for a "wiped" verdict (else 0): the share of the window's gradient by absolute mass
    #: that appeared between backward passes (a term added to ``.grad`` by a hook or a
    #: callback, or the running sum scaled up); a recording made before it reads 0
    added: float = 0.0
    #: the common scale c between what the optimizer received and the sum of the
    #: contributions (received ~ c * sum): 1 when nothing rescaled the gradient between the
    #: last backward and the step; clipping/unscaling give c < 1, a hand-written
    #: all_reduce(SUM) on an engine that already averaged gives c = W
    scale: float = 1.0
    #: the part of ``scale`` a norm clip after the window's last backward applied (its
    #: coefficient, ``min(1, max_norm / (norm + 1e-6))``, read from the norm it returned);
    #: 1 when none ran or it was not read. The large batch clips by its own norm too, so
    #: the loss-weight ledger judges ``scale / clip``. A recording made before it reads 1
    clip: float = 1.0
    #: the two linear checksum columns (sum, even-index sum) of every parameter, flattened:
    #: of the sum of this rank's contributions and of what the optimizer received. Linear,
    #: so across ranks received = c * (sum over ranks of contrib) when the script itself
    #: all-reduced .grad (the cross-rank F10 rule of ``watch`` fits c offline)
    contrib_sums: tuple[float, ...] = ()
    received_sums: tuple[float, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Conservation:
        """The verdict as a recording holds it (JSON lists back to tuples; keys a later
        version added are ignored, keys an earlier one lacked take their defaults)."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in d.items() if k in known}
        return cls(**kw)


@dataclass(frozen=True)
class StepRecord:
    """One window, closed by an optimizer step (or, for the guard, one closed window).

    The fields up to ``lr`` are the observation layer's and, ``updates`` aside,
    the keys of a recording's step line; the fields after it are counts only the guard or
    the audit tallies (never written to a recording)."""

    step: int  # 0-based optimizer step (the guard: the window's index)
    backwards: int = 0  # backward passes in the window
    window_loss: float | None = None
    # False when every gradient was None or the engine skipped the update
    applied: bool = True
    source: str = "torch"  # "torch" | "deepspeed"
    optimizer: str = ""
    engine: str = "local"
    zero_grads: int = 0  # zero_grad calls between the window's first backward and this step
    zero_grads_between: int = 0  # ... between two backwards of the window
    # scheduler steps of the window: the observation layer counts those since the previous
    # step; the guard and the audit give the boundary work right after a step to that step
    scheduler_steps: int = 0
    # scheduler steps given their position (``scheduler.step(epoch + i / n)``): the schedule
    # is where the script puts it, not where the calls count it; not in ``scheduler_steps``
    scheduler_positioned: int = 0
    clips: int = 0
    clip_micros: list[int] = field(default_factory=list)  # backward index after each clip
    clip_functions: list[str] = field(default_factory=list)  # which clipping functions ran
    data_pass_starts: list[int] = field(default_factory=list)  # backwards before a new epoch
    reductions: int = 0  # gradient collectives in the window (backwards + between)
    # backwards (or flushes) that issued at least one (the audit: intervals between two
    # backwards with a gradient collective or a DDP forward that decided to all-reduce)
    reduction_rounds: int = 0
    sync_micros: list[bool | None] = field(default_factory=list)  # per backward: synced?
    sync_mismatch: list[int] = field(default_factory=list)  # micro-steps whose flag flipped
    sync_backward: list[bool | None] = field(default_factory=list)  # per backward: flag at it
    # per backward: watched forwards since the previous backward (K forwards then one
    # backward is the summed-loss form of accumulation, not a step per micro-step)
    forwards: list[int] = field(default_factory=list)
    ds_boundaries: list[bool | None] = field(default_factory=list)
    ds_coalescing: list[bool] = field(default_factory=list)
    ds_micro_ids: list[int | None] = field(default_factory=list)  # ZeRO's micro_step_id per backward
    engine_step_calls: int = 0  # DeepSpeed engine.step() calls in the window
    max_backwards_per_engine_step: int = 0  # ... before an engine.step() call that did not step
    # a window without a backward pass: did its step change the parameters? (None: a
    # window with backwards, or not measured)
    moved_without_backward: bool | None = None
    grad_norm: float | None = None  # DeepSpeed's global norm (pre-clip) when available
    conservation: Conservation | None = None
    checksum: list[float] | None = None  # (sum, even sum, abs sum) of what the optimizer got
    wall: float = 0.0
    param_dtype: str | None = None  # dtype of the parameters this step updated ("float32")
    # the update of each parameter (the observation layer only, never written)
    updates: dict[str, torch.Tensor] | None = field(repr=False, default=None)
    # per loss call of the window (cross_entropy/nll_loss that reached the optimizer):
    # [site, order at that site in its backward, micro (0-based), valid count n,
    #  per-token weight, low precision, reduction, sole, via autograd.grad, the constants
    #  between the call and the root, what n counts, the rows of the call's input (0:
    #  unknown; a line written before it existed lacks it)]; None: fewer than 2 micro-steps
    #  had one (on one rank)
    losses: list[list[Any]] | None = None
    # a GradScaler skipped the step (inf/NaN gradients): the window's gradients are dropped,
    # not carried into the next window
    discarded: bool = False
    # what the engine multiplies the sum over ranks of the ranks' gradients by (1/W: DDP's,
    # FSDP2's, DeepSpeed's average); None: unknown, no engine, or no loss record this step
    rank_factor: float | None = None
    # several optimizers over disjoint parameters: which one stepped (1-based, by first
    # appearance), its window being the backwards that reached its parameters; None: the
    # window is everything since the previous step of any optimizer
    optimizer_index: int | None = None
    # where the window's gradient was summed and in which dtype, when anything is bf16/fp16
    # (:func:`accumguard.observe._precision.step_facts`); None: all fp32/fp64
    precision: dict[str, Any] | None = None
    # the norm of the parameters the step updated, before it (recorded with ``updates``:
    # invariance's bound on the re-rounding of low-precision weights)
    param_norm: float | None = None
    # how often the optimizers' learning rates changed between two backward passes of this
    # window, and the first group's rate at the step (:mod:`accumguard.observe._lr_trace`);
    # None: not traced
    lr_changes: int | None = None
    lr: float | None = None
    # the terms of each backward's loss and the per-token log-prob selections of the window
    # (:mod:`accumguard.observe._losses_terms`); None: none recorded
    terms: list[list[Any]] | None = None
    # the step ran inside a backward pass (an optimizer stepped from a gradient hook, e.g.
    # ``register_post_accumulate_grad_hook``: "optimizer in backward"): its window is cut by
    # the backward it ran in, so no window rule can read it (the loader sets such steps
    # apart)
    in_backward: bool = False
    # for such a step, the run's 0-based ordinal of the backward pass it ran inside (the
    # F1 rule of optimizers in backward asks whether every backward pass stepped); else None
    backward_pass: int | None = None
    # a parameter the step updated had a tensor hook (``p.register_hook``) when the step
    # ran: such a hook may rescale the gradient between the loss and ``.grad`` (the gradient
    # divided by K by hand there), so the loss record's total weight is not the update's
    # scale (the rules that read it as one skip the window). Recorded with the loss record
    # only. A line written before it existed reads back False
    grad_hooks: bool = False
    # a norm clip that ran before the window's GradScaler.unscale_: [the loss scale, the
    # norm it measured (of the scaled gradient), its max_norm]; None when none did. Last of
    # the recorded fields: a line written before it existed reads back None
    clip_before_unscale: list[float] | None = None
    # the window was begun again at a zero_grad that followed an in-place change of the
    # parameters without an optimizer step (sharpness-aware minimisation's ascent step, a
    # weight perturbation): its first pass probed the perturbation; the record is the pass
    # after it. How often (0: never). A line written before it existed reads back 0
    restarts: int = 0
    # which optimizer (or DeepSpeed engine) object stepped: 1-based in the order of their
    # first steps in this process (a reference run's optimizer after the training's, an
    # optimizer rebuilt on resume: each its own number); None in a line written before it
    opt_serial: int | None = None
    # backward passes the window left out: they ran before its optimizer was made, when
    # none of that optimizer's parameters held a gradient (an abandoned model's, in a run
    # rebuilt to resume), so none is in this step's gradient; 0: none
    unborn: int = 0
    # FSDP2 units whose reductions disagree (``set_gradient_divide_factor`` on one unit
    # only): per distinct factor, [the factor, its units' module names (a few), how many
    # units]; None when every unit reduces alike (``rank_factor`` is then their factor)
    rank_factor_units: list[list[Any]] | None = None
    # FSDP2: the largest number of ranks any unit's mesh spans (its reduce-scatter group, with
    # the replicate dimension of HSDP); None: not FSDP2, or not read
    fsdp_mesh: int | None = None
    # an optimizer's first window, read only when it was made beside one that had stepped
    # (a run rebuilt to resume) and has its own window: whether its first backward found a
    # nonzero gradient on its parameters (a restored partial window); None: not read
    began_on_grad: bool | None = None
    # a DDP communication hook of the script's (``register_comm_hook``): per call of it in
    # the window, [the backward pass it ran in (0-based), the sum of the bucket it was
    # given, this rank's own gradient before the hook]; with every rank's step the factor
    # the hook applied to the sum over ranks is fitted offline. None: no such hook ran
    hook_in: list[list[float]] | None = None
    # a clipping call given only tensors that hold no gradient and require none (the local
    # shards ``p.grad.to_local()``, not the parameters): it read no ``.grad`` and clipped
    # nothing. Per such call, [backward passes before it, tensors it was given]; None: none
    clip_empty: list[list[int]] | None = None
    # a clipping call given parameters that require a gradient but held none then (cleared
    # by the previous step: a clip before the window's first backward) and hold one at the
    # step: it clipped nothing of this window's gradient. Per such call, the backward passes
    # before it; None: none
    clip_unset: list[int] | None = None
    # Accelerate: the backward passes of each ``accumulate()`` block the window's
    # ``accelerator.backward`` calls ran in (Accelerate counts its micro-steps in blocks,
    # and a block may run several backwards); None: no accelerator.backward
    accelerate_blocks: list[int] | None = None
    # DDP: parameters the stepping optimizer holds that no DDP-wrapped module holds (DDP
    # averages only its module's gradients); FSDP2: those no ``fully_shard`` unit holds;
    # by name, at most three and a count of the rest; None: none, or neither engine
    unwrapped: list[str] | None = None
    # FSDP2: the checksum of what the optimizer received for the parameters of
    # ``unwrapped`` (those no ``fully_shard`` unit holds: plain tensors, not DTensors, whose
    # gradients FSDP2 never reduces), comparable across ranks; DDP or FSDP2 where the step's
    # checksum is not kept (a backward in the step's closure): [sum, sum of squares] of
    # their .grad right after the step; None: none, or not checked
    loose_checksum: list[float] | None = None
    # DDP under ``Join``: the wrapper's ``divide_by_initial_world_size`` at the step (True:
    # the sum is divided by the launch's world size even when ranks have run out of data);
    # None: not a DDP run, or no Join seen
    join_initial: bool | None = None
    # the optimizer had step pre-hooks of its own (``register_step_pre_hook``), which run
    # after the step's checksum was read: what it received may differ from that checksum
    # (a hand all-reduce of the gradients inside such a hook); False: none
    pre_hooked: bool = False
    # a post-accumulate-grad hook of the script's (``register_post_accumulate_grad_hook``)
    # multiplied a parameter's accumulated ``.grad`` by a scalar inside a backward (a
    # per-parameter clip): per backward pass where one did, [the pass (0-based), parameters
    # rescaled, parameters measured in that pass, smallest factor, largest factor]; None:
    # none did, no such hook ran, or the window was not read (several optimizers' windows)
    grad_rescaled: list[list[float]] | None = None
    # the backward passes before each zero_grad counted between the window's backwards (a
    # skipped window's gradient discarded: a clip before it acted on what was discarded);
    # None: none
    zero_micros: list[int] | None = None
    # several optimizers with windows of their own: per backward of this optimizer's window
    # (in order), the constants between its loss (one recorded loss call, or one mean built
    # by hand) and the backward's root, read from the backwards of the shared window that
    # reached its parameters; None: one optimizer, the same backwards, or not read
    lane_scales: list[list[list[Any]]] | None = None
    # -- counts of the guard and the audit (not in a recording) ---------------------------
    # optimizer steps that closed the window: 1, 2 for a second step a guard in warn mode
    # let run, 0 for the audit's trailing micro-steps after the last step
    optimizer_steps: int = 1
    forward_calls: int = 0  # forwards of the model under audit in the window
    # every zero_grad call of the window, those right after its step included (the audit's
    # boundary work belongs to the step it follows); ``zero_grads`` counts those inside
    zero_grad_calls: int = 0
    ddp_sync_rounds: int = 0  # backwards whose DDP forward decided to all-reduce (audit)
    other_collective_calls: int = 0  # collectives that reduce no gradient (audit)
    loss_calls: int = 0  # calls of the audit's loss helper (ctx.loss_fn)
    # reduce collectives issued inside DeepSpeed's engine.step() (its gradient-norm and
    # overflow all-reduces): not gradient reductions, so counted apart (audit)
    step_reduce_calls: int = 0
    # optimizer.step() calls that found no gradient at all (a no-op for torch optimizers:
    # FSDP2 steps between unsynchronised micro-steps); not counted as steps (audit)
    gradless_steps: int = 0

    # -- the guard's names for its counts --------------------------------------------------
    @property
    def index(self) -> int:
        """The window's 0-based index (the guard's name for ``step``)."""
        return self.step

    @property
    def backward_passes(self) -> int:
        """Backward passes in the window (the guard's name for ``backwards``)."""
        return self.backwards

    @property
    def sync_rounds(self) -> int:
        """Backward passes that all-reduced (DDP: the flag at the forward decided so)."""
        return sum(1 for s in self.sync_micros if s)

    # -- the audit's names for its counts (its report's JSON keys) -------------------------
    @property
    def forward(self) -> int:
        """Forwards of the model under audit (``forward_calls``)."""
        return self.forward_calls

    @property
    def backward(self) -> int:
        """Backward passes (``backwards``)."""
        return self.backwards

    @property
    def grad_collective_calls(self) -> int:
        """Gradient-reducing collective calls (``reductions``)."""
        return self.reductions

    @property
    def grad_collective_rounds(self) -> int:
        """Rounds of gradient reduction (``reduction_rounds``)."""
        return self.reduction_rounds

    @property
    def zero_grad(self) -> int:
        """Every zero_grad call of the window (``zero_grad_calls``)."""
        return self.zero_grad_calls

    @property
    def zero_grad_in_window(self) -> int:
        """zero_grad calls after the window's first backward, before its step (F3)."""
        return self.zero_grads

    # -- the recording ---------------------------------------------------------------------
    def as_dict(self, rank: int) -> dict[str, Any]:
        """The line ``watch`` writes for this step (``kind``, ``rank`` and every recorded
        field; not ``updates``' tensors). Conservation's per-parameter checksum columns are
        kept only where the cross-rank F10 fit reads them (the script's own all-reduce on
        a run with no engine). Shallow: ``dataclasses.asdict`` deep-copied every list, on
        every step."""
        rec: dict[str, Any] = {"kind": "step", "rank": rank}
        # one C call reads every field (a Python loop of getattr was ~1000 bytecodes a step)
        rec.update(zip(_RECORDED_FIRST, _read_recorded(self), strict=True))
        for name in _LIST_FIELDS:  # (the fields typed as lists: the others hold none)
            v = rec[name]
            if isinstance(v, list):
                rec[name] = list(v)
        cons = self.conservation  # written last, as a dict
        if cons is None:
            rec["conservation"] = None
        else:
            rec["conservation"] = c = {f: getattr(cons, f) for f in _CONSERVATION}
            # the script's own all-reduce; or a DDP window whose gradient changed between
            # its backwards (the parent compares what every rank received with all ranks'
            # contributions: a stash put back before the step lost nothing)
            if (self.reductions and self.engine == "local") or (
                    self.engine == "ddp" and not cons.ok and cons.reason == "wiped"):
                c["contrib_sums"], c["received_sums"] = (list(c["contrib_sums"]),
                                                         list(c["received_sums"]))
            else:
                del c["contrib_sums"], c["received_sums"]
        return rec

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepRecord:
        """A step line of a recording (``kind``, ``rank`` and keys this version does not
        know are ignored; keys an older recording lacks take their defaults)."""
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in _RECORDED}
        cons = kw.get("conservation")
        if isinstance(cons, Mapping):
            kw["conservation"] = Conservation.from_dict(cons)
        return cls(**kw)

    @classmethod
    def of_counts(cls, step: int, counts: Mapping[str, int]) -> StepRecord:
        """A record of counts only (``counts``: names of the record's int fields, the
        audit's tallies); the other fields keep their defaults."""
        kw: dict[str, Any] = dict(counts)  # (** of int values, typed against every field)
        return cls(step=step, **kw)

    def audit_counts(self) -> dict[str, int]:
        """The audit report's ``counts`` object (its JSON keys, see ``audit.schema.json``)."""
        return {key: int(getattr(self, name)) for key, name in AUDIT_COUNTS.items()}


_EXTRA = ("optimizer_steps", "forward_calls", "zero_grad_calls", "ddp_sync_rounds",
          "other_collective_calls", "loss_calls", "step_reduce_calls", "gradless_steps")
#: the fields a recording's step line holds (in order); ``updates`` and the guard's and the
#: audit's counts are not recorded
_RECORDED = tuple(f.name for f in fields(StepRecord) if f.name not in ("updates", *_EXTRA))
#: the recorded fields but ``conservation`` (written last), and one getter of them all
_RECORDED_FIRST = tuple(n for n in _RECORDED if n != "conservation")
_read_recorded = attrgetter(*_RECORDED_FIRST)
_LIST_FIELDS = tuple(f.name for f in fields(StepRecord)
                     if f.name in _RECORDED_FIRST and "list[" in str(f.type))
_CONSERVATION = tuple(f.name for f in fields(Conservation))

#: the audit report's count keys (stable JSON) -> the record's fields
AUDIT_COUNTS: dict[str, str] = {
    "forward": "forward_calls", "backward": "backwards",
    "grad_collective_rounds": "reduction_rounds", "grad_collective_calls": "reductions",
    "ddp_sync_rounds": "ddp_sync_rounds", "other_collective_calls": "other_collective_calls",
    "optimizer_steps": "optimizer_steps", "scheduler_steps": "scheduler_steps",
    "zero_grad": "zero_grad_calls", "zero_grad_in_window": "zero_grads",
    "loss_calls": "loss_calls", "step_reduce_calls": "step_reduce_calls",
    "gradless_steps": "gradless_steps",
}


def sum_records(records: list[StepRecord], *, step: int = 0) -> StepRecord:
    """The audit's counts summed over ``records`` (a run's totals); the other fields keep
    their defaults."""
    return StepRecord.of_counts(step, {name: sum(int(getattr(r, name)) for r in records)
                                       for name in AUDIT_COUNTS.values()})
