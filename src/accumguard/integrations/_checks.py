"""The accumulation checks the framework callbacks run (internal to ``integrations``).

What it measures, without changing a number the loop computes:

* :class:`~accumguard.observe.tokens.TokenWeightProbe` (observation layer) hooks the
  module that produces the logits and recovers, per micro-step, the valid-token count
  ``n_i`` and the weight ``s_i`` the loss gave each token (see its module).
* :class:`AccumulationChecks` groups those records into windows (an optimizer
  step post-hook ends a window), gathers them over ranks (two small
  all-gathers per step), and :func:`classify_window` (the verdict of
  :func:`accumguard.observe.rules.classify_token_weights`) names what the optimizer
  received: ``OK``, F5 (each micro-batch normalised by its own count), F6
  (each rank by its own count), F10 (off by the world size), F7 (a partial
  window scaled as a full one), or ``LOSS_SCALE`` (any other constant factor).
  It also counts LR-scheduler steps per optimizer step on the *inner* scheduler
  (F4; Accelerate's wrapper steps it W times).
* The boundary contract comes from the one observation layer,
  :class:`accumguard.observe.Observer` (the layer ``accumguard watch`` injects):
  gradient conservation (F3, F2/F3, F7 stale gradient), clipping inside the
  window (F8), the DDP sync flag of the last micro-step (F11), windows longer
  than K (F13). :func:`boundary_findings` applies the per-window rules of
  :mod:`accumguard.observe.rules` (the ones ``accumguard watch`` runs) to each step event.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, cast

import torch

from accumguard.core.errors import (
    AccumguardError,
    AccumulationError,
    ConfigError,
    rank_prefix,
)
from accumguard.core.findings import Finding, Severity
from accumguard.core.taxonomy import fix_for, title
from accumguard.integrations._figures import event_figures, token_weight_error
from accumguard.integrations._notes import InfoNotes
from accumguard.observe import Patches, sampled
from accumguard.observe._agree import gather_rows
from accumguard.observe._events import ScalerEvent, StepEvent
from accumguard.observe._failsafe import Failsafe, Failure
from accumguard.observe._patch_torch import constructor_step
from accumguard.observe.rules import (
    WEIGHT_TOL,
    WEIGHT_TOL_LOW_PRECISION,
    classify_token_weights,
    live_findings,
    step_record,
)
from accumguard.observe.tokens import TokenWeightProbe, find_logits_module

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.utils.hooks import RemovableHandle

    from accumguard.integrations._comm import CheckedLedger
    from accumguard.observe import Observer

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S")


class _Scale(Protocol):
    """What the probe reads of a GradScaler (torch's, FSDP's ShardedGradScaler, ...)."""

    def get_scale(self) -> float: ...

__all__ = ["DEFAULT_EVERY_N_STEPS", "AccumulationChecks", "Finding", "TokenWeightProbe", "boundary_findings",
           "callback_dict", "classify_window", "find_logits_module", "unwrap_optimizer", "unwrap_scheduler"]

log = logging.getLogger("accumguard")

# What the callbacks check by default: one optimizer step in 10 (systematic bugs show on every
# step; the sampled steps carry the probe's and the gradient checksums' cost, measured in
# benchmarks/bench_integrations.py). Pass every_n_steps=1 to check every step.
DEFAULT_EVERY_N_STEPS = 10
# How far (relative to the rows' abs sum) the probed gradient may be from a token
# cross-entropy's signature and still be judged (fp32 rounding is ~1e-6; bf16/fp16 scale it
# by their tolerance); a hidden layer or a regression head is off by O(1).
_SIGNATURE_TOL = 1e-2
# With every_n_steps > 1, the gradient-conservation checksums (the costliest check) run on
# the sampled steps only within CONSERVATION_BUDGET of the run's time (the first checked
# step always runs; a zero_grad inside an unchecked window forces the next FORCED_CHECKS).
# Local to each rank: conservation exchanges nothing, so ranks may sample different steps
# (the probe's schedule, which all-gathers, is ``observe.sampled(step, every_n_steps)``, the
# same on every rank).


def callback_dict(f: Finding) -> dict[str, object]:
    """A finding as the callbacks record it (``trainer.state.accumguard_findings``, the
    checks' :meth:`~AccumulationChecks.summary`): ``step`` (1-based, as every report and
    the frameworks' ``global_step`` after it), ``class_id``, ``title``, ``evidence``, ``fix``."""
    return {"step": f.step, "class_id": f.cls, "title": f.title, "evidence": f.evidence,
            "fix": f.fix}


def _finding(step: int, class_id: str, evidence: str) -> Finding:
    """An error-level finding of the callbacks at the 0-based optimizer step index ``step``
    (shown 1-based); a callback judges every rank's gathered records, so it names no rank.
    Its ``str`` is the callbacks' log line: ``accumguard step S: CLASS title: evidence. Fix:
    fix``."""
    return Finding(class_id, Severity.ERROR, None, step + 1, None, evidence, fix_for(class_id),
                   title(class_id))


def _hookable(opt: object) -> bool:
    """A torch optimizer that ran ``torch.optim.Optimizer.__init__`` (its step hooks exist):
    Accelerate's ``DeepSpeedOptimizerWrapper`` subclasses it without running it."""
    return (isinstance(opt, torch.optim.Optimizer)
            and hasattr(opt, "_optimizer_step_post_hooks"))


def unwrap_optimizer(opt: object) -> Any:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` or Lightning's
    ``LightningOptimizer`` (hooks must sit on the object that really steps); inside
    Accelerate's ``DeepSpeedOptimizerWrapper`` (the HF Trainer's optimizer under DeepSpeed
    too) the DeepSpeed engine's optimizer (a ZeRO optimizer, not a torch one: the engine's
    ``step()`` is then the optimizer step, see :class:`AccumulationChecks`)."""
    for attr in ("optimizer", "_optimizer"):
        inner = getattr(opt, attr, None)
        if _hookable(inner):
            return inner
    if _hookable(opt):
        return opt
    inner = getattr(opt, "optimizer", None)
    if inner is not None and _deepspeed_engine_class() is not None:
        return inner
    raise ConfigError(f"expected a torch optimizer (or a framework wrapper of one), got "
                      f"{type(opt).__name__}")


def _deepspeed_engine_class() -> type | None:
    """DeepSpeed's engine class when DeepSpeed is already imported (never imported here)."""
    mod = sys.modules.get("deepspeed.runtime.engine")
    return getattr(mod, "DeepSpeedEngine", None) if mod is not None else None


def unwrap_scheduler(sched: _S) -> _S:
    """The torch LR scheduler inside Accelerate's ``AcceleratedScheduler`` (which steps its
    inner scheduler ``num_processes`` times per optimizer step unless ``split_batches``)."""
    inner = getattr(sched, "scheduler", None)
    # the inner scheduler stands where the wrapper stood (both have step())
    return inner if inner is not None and hasattr(inner, "step") else sched


def classify_window(ranks: list[torch.Tensor], *, world_size: int, averages_over_ranks: bool,
                    accumulation_steps: int, step: int, tol: float = WEIGHT_TOL
                    ) -> Finding | None:
    """Name what the optimizer received from the probe records of one window
    (:func:`accumguard.observe.rules.classify_token_weights`; ``ranks[r]`` is rank r's
    ``[m, 3]`` records). None when every valid token carried the weight ``1/N``."""
    verdict = classify_token_weights([recs.tolist() for recs in ranks], world_size=world_size,
                                     averages_over_ranks=averages_over_ranks,
                                     accumulation_steps=accumulation_steps, tol=tol)
    return None if verdict is None else _finding(step, verdict[0], verdict[1])


def boundary_findings(event: StepEvent, *, accumulation_steps: int) -> list[Finding]:
    """Error-level findings from one :class:`accumguard.observe.StepEvent` (what the
    observer saw between two optimizer steps on this rank), by the per-window rules of
    :func:`accumguard.observe.rules.live_findings` (the rules ``accumguard watch`` runs)."""
    record = step_record(event, 0)
    return [_finding(int(event.step), f.cls, f.evidence)
            for f in live_findings(record, rank=None, k=accumulation_steps)
            if f.severity == "error"]


def safe_callback(fn: Callable[_P, _R]) -> Callable[_P, _R | None]:
    """A framework callback method that only observes: an internal error of accumguard in
    it never reaches the training loop. accumguard's deliberate errors (a ``ConfigError``
    at the start, ``strict`` findings) pass; anything else switches the callback's checks
    off (on every rank at their next gather) and is said on stderr, once."""

    @functools.wraps(fn)
    def method(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        self = args[0] if args else None
        try:
            return fn(*args, **kwargs)
        except AccumguardError:
            raise
        except Exception as exc:  # noqa: BLE001 - never into the user's training
            checks = getattr(self, "checks", None)
            fs = checks.failsafe if isinstance(checks, AccumulationChecks) else Failsafe(
                "accumguard (callback)")
            fs.fail(f"{type(self).__name__}.{fn.__name__}", exc)
            return None

    return method


class AccumulationChecks(InfoNotes):
    """Probe + optimizer/scheduler hooks; findings after every (``every_n_steps``-th) step.

    Args:
        model: the model (or wrapper) whose logits are probed.
        optimizer: the optimizer (framework wrappers are unwrapped).
        accumulation_steps: K, micro-steps per optimizer step and rank.
        scheduler: LR scheduler whose steps are counted (wrappers unwrapped); optional.
        averages_over_ranks: the gradient reduction divides by the world size (DDP,
            FSDP2, Accelerate, Lightning DDP); default: True on more than one rank.
        logits_module: the layer producing logits (default: :func:`find_logits_module`).
        every_n_steps: check one step in n (:func:`accumguard.observe.sampled`: step 0, then
            one per block of n with a moving phase); the scheduler count is checked every
            step, and a window whose hook-free counts are unusual (a zero_grad, a DataLoader
            pass or a clip between backwards, a backward count other than K) is judged
            whenever it comes; the probe, the sync flags and the checksums cost nothing on
            the other steps; the checksums run on the sampled steps within
            :data:`CONSERVATION_BUDGET` of the run's time.
        strict: raise :class:`~accumguard.core.errors.AccumulationError` on a finding
            instead of logging it.
        on_finding: called with every :class:`Finding`.
        observe: also run the observation layer (:class:`accumguard.observe.Observer`,
            rooted at ``model``) for the boundary contract; see :func:`boundary_findings`.
            It also tells the probe about a GradScaler (its scale, its skipped steps):
            with ``observe=False`` an fp16 run with a GradScaler reads as LOSS_SCALE.
        fix_hints: class id -> a sentence appended to that class's fix, in the words of
            the framework the checks run in (the callbacks pass theirs).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, *, accumulation_steps: int,
                 scheduler: object = None, averages_over_ranks: bool | None = None,
                 logits_module: torch.nn.Module | None = None, every_n_steps: int = 1,
                 strict: bool = False, on_finding: Callable[[Finding], None] | None = None,
                 process_group: ProcessGroup | None = None, observe: bool = True,
                 fix_hints: dict[str, str] | None = None) -> None:
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ConfigError(f"every_n_steps ({every_n_steps!r}) must be a positive int")
        import torch.distributed as dist

        self._dist = dist.is_available() and dist.is_initialized()
        self.group = process_group
        self.rank = dist.get_rank(process_group) if self._dist else 0
        self.world_size = dist.get_world_size(process_group) if self._dist else 1
        self.averages_over_ranks = (self.world_size > 1 if averages_over_ranks is None
                                    else averages_over_ranks)
        self.accumulation_steps = accumulation_steps
        self.every_n_steps = every_n_steps
        self.strict = strict
        self.on_finding = on_finding
        self.findings: list[Finding] = []
        self.fix_hints = dict(fix_hints or {})
        self.steps = 0
        self.checked_steps = 0
        self.figures: dict[str, float] = {}  # the last checked step's (see ._figures)
        # every hook and wrapper of the checks runs behind this door: an internal error
        # switches the checks off (on every rank together, at the next gather), never the run
        self.failsafe = Failsafe("accumguard (callback)", step=lambda: self.steps)
        self.failure: Failure | None = None  # accumguard's own failure, once the checks are off
        self._off = False
        self._probing = True  # the probe's hook is on (the next window is checked)
        self.probe = TokenWeightProbe(logits_module or find_logits_module(model),
                                      failsafe=self.failsafe)
        self.optimizer = unwrap_optimizer(optimizer)
        self._patches = Patches(self.failsafe)  # scheduler and engine step wrappers
        self._step_handle: RemovableHandle | None = None
        if _hookable(self.optimizer):
            self._step_handle = self.optimizer.register_step_post_hook(self._after_step)
        else:  # a DeepSpeed engine's optimizer: the engine's step() that updated ends a window
            self._hook_engine_steps(self.optimizer)
        self.scheduler = unwrap_scheduler(scheduler) if scheduler is not None else None
        # The steps counted are the calls of the scheduler given: Accelerate's wrapper steps
        # its inner schedule num_processes times per call by design (split_batches=False: the
        # schedule is then meant in batches of the unprepared dataloader), which is one
        # scheduler step for F4, as ``accumguard watch`` counts it; said once, as info.
        self._sched_steps = 0
        self._said_sched_w = False
        self._scaler: _Scale | None = None  # a GradScaler seen unscaling: the probe reads scaled grads
        self._said_not_ce = False
        self._said_mixed = False
        self._said_f1 = False
        self._held_f7: Finding | None = None  # see _after_step
        self._in_wrapper = False
        if scheduler is not None:
            inner = self.scheduler

            def outer_step(previous: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                before = getattr(inner, "last_epoch", None)
                self._in_wrapper = True
                try:
                    out = previous(*args, **kwargs)
                finally:
                    self._in_wrapper = False
                after = getattr(inner, "last_epoch", None)
                if not (isinstance(before, int) and isinstance(after, int)):
                    self._sched_steps += 1  # unknown: counted as a step
                    return out
                if after > before:  # stepped its schedule (not a skipped step)
                    self._sched_steps += 1
                if after - before > 1:
                    self._say_wrapper_steps(after - before)
                return out

            def inner_step(previous: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                # called directly (or no wrapper): one step each, but never the constructor
                # step (SequentialLR makes it for its first scheduler when it is built)
                if not self._in_wrapper and not constructor_step(inner):
                    self._sched_steps += 1
                return previous(*args, **kwargs)

            if inner is not scheduler:
                self._patches.wrap(scheduler, "step",
                                   functools.partial(functools.partial, outer_step))
            self._patches.wrap(inner, "step", functools.partial(functools.partial, inner_step))
        self.observer: Observer | None = None
        self.comm: CheckedLedger | None = None  # the collective ledger (with observe)
        if observe:
            from accumguard.observe import Observer
            from accumguard.observe import _profiles as profiles

            # no loss record: the token-weight probe answers its question (F5) here; no
            # window loss: the boundary rules do not read it (a host read per step saved)
            # sampled records: the boundary rules judge the probe's sampled windows (and the
            # windows after a reset inside an unchecked one); the others cost ~nothing
            weight = getattr(self.probe._module, "weight", None)
            self.observer = Observer.from_profile(
                profiles.callbacks(every_n_steps, accumulation_steps), [model],
                failsafe=self.failsafe,
                boundary_param=weight if isinstance(weight, torch.nn.Parameter) else None)
            self.observer.add_listener(self)
            self.observer.install()
            from accumguard.integrations._comm import CheckedLedger

            self.comm = CheckedLedger(self)  # the collective ledger of the checked steps

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Check the last step's scheduler count, remove every hook, restore the scheduler."""
        if self.probe is None:
            return
        held, self._held_f7 = self._held_f7, None
        live = not self._off and self.failsafe.ok  # after a failure nothing is judged
        try:
            if live:
                self.failsafe.guard("closing the checks", self._check_scheduler, self.steps - 1)
        finally:
            with contextlib.suppress(Exception):  # never an error of the training's
                if self.observer is not None:
                    self.observer.uninstall()
                    self.observer = None
                self.probe.close()
                if self._step_handle is not None:
                    self._step_handle.remove()
                self._patches.undo()
            self.probe = None  # type: ignore[assignment]
            if self.failure is None:
                self.failure = self.failsafe.failure
        if held is not None and live:  # no window came after it: a short last window (F7)
            self._report(held)

    def __enter__(self) -> AccumulationChecks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def scale_next_window(self, factor: float) -> None:
        """An exact path rescales the accumulated gradient by ``factor`` at the boundary
        (after the micro-steps' backwards): account for it in this window's weights."""
        self.probe.scale = factor

    def _hook_engine_steps(self, target: object) -> None:
        """Under DeepSpeed (Accelerate's wrapper, the HF Trainer) the optimizer step is the
        ``engine.step()`` that updated (``global_steps`` moved; Accelerate calls it inside
        ``accelerator.backward`` at the boundary, its optimizer wrapper's ``step`` is a
        no-op): end the window there, for the engine whose optimizer is ``target`` only. (A
        ZeRO optimizer may step its inner torch optimizer once per parameter group: its
        hooks would end several windows per step.)"""
        cls = _deepspeed_engine_class()
        if cls is None:
            raise ConfigError(f"cannot attach to {type(target).__name__}: not a torch "
                              "optimizer, and DeepSpeed is not imported")

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def step(engine: Any, /, *args: Any, **kwargs: Any) -> Any:
                if getattr(engine, "optimizer", None) is not target:
                    return orig(engine, *args, **kwargs)
                before = getattr(engine, "global_steps", None)
                out = orig(engine, *args, **kwargs)
                if getattr(engine, "global_steps", None) != before:
                    self._after_step(target, args, kwargs)
                return out

            return step

        self._patches.wrap(cls, "step", make)

    # -- per step ---------------------------------------------------------------------
    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's post-hook. Never raises an internal error: the bookkeeping that
        keeps the ranks in lock-step (which steps are gathered) always runs; the work is
        behind the fail-safe door; the gather is joined by every rank whatever its state,
        and when accumguard failed on any rank every rank switches its checks off."""
        if self._off:
            return
        if not self.failsafe.ok and self.world_size == 1:
            self._drop()
            return
        step = self.steps
        self.steps += 1
        held, self._held_f7 = self._held_f7, None
        # which windows are gathered is decided from plain counters, identical on every
        # rank whatever happened to its hooks (a rank that failed still joins the gather)
        probed = self._probing  # this window was checked (sampled, or handed a sample)
        self._set_probing(sampled(self.steps, self.every_n_steps))  # the next step checked?
        if held is None and not probed:
            self.failsafe.guard("callback step", self._unchecked_step, step)
            return
        if self.world_size == 1:
            recs = self.failsafe.guard("callback step", self._window_rows, step)
            ranks = None if recs is None else [recs]
        else:
            ranks = gather_rows(self.failsafe, lambda: self._window_rows(step),
                                world=self.world_size, group=self.group,
                                device=self._gather_device(), where="callback step")
        if ranks is None:
            self._drop()
            return
        self.failsafe.guard("callback step", self._judge, step, held, ranks)

    def _set_probing(self, on: bool) -> None:
        self._probing = on
        self.failsafe.guard("the probe's hook", setattr, self.probe, "active", on)

    def _drop(self) -> None:
        """Checks off on this rank (every rank reaches it at the same gather)."""
        self._off = True
        self.failure = self.failsafe.failure
        with contextlib.suppress(Exception):
            self.probe.active = False
        if self.rank == 0:
            log.warning("accumguard: the checks are off from optimizer step %d on: accumguard "
                        "failed on %s (its own error, not the training's; the run is "
                        "unchanged; see that rank's stderr)", self.steps,
                        "this process" if self.failure is not None else "another rank")

    def _gather_device(self) -> torch.device:
        if torch.distributed.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _unchecked_step(self, step: int) -> None:
        if step > 0:
            self._check_scheduler(step - 1)
        self._sched_steps = 0
        self.probe.discard()  # an unchecked step recorded nothing; an exact path's scale

    def _window_rows(self, step: int) -> torch.Tensor:
        """This rank's probe records of the window (before the gather)."""
        if step > 0:
            self._check_scheduler(step - 1)
        self._sched_steps = 0
        # What the loop did to the accumulated gradient before the clip/step (a GradScaler's
        # unscale, an exact path's W/N, accumguard's or hand-written) is measured on the
        # logits weight's gradient where the observer checked the window: it replaces the
        # factors declared to the probe; else the scaler's scale divides dL/dlogits.
        measured = self.observer.boundary_scale() if self.observer is not None else None
        mixed = measured is not None and math.isnan(measured)  # changed, not by one scale
        if measured is not None and not mixed:
            self.probe.scale = measured
        elif self._scaler is not None:
            self.probe.scale /= float(self._scaler.get_scale())
        recs = self.probe.take()
        if mixed:
            recs[:, 3] = math.inf  # not judged: decided after the gather, on every rank alike
        return recs.to(torch.float64)

    def _judge(self, step: int, held: Finding | None, ranks: list[torch.Tensor]) -> None:
        """The window's verdict from every rank's records (the same on every rank)."""
        self.checked_steps += 1
        tol = WEIGHT_TOL_LOW_PRECISION if self.probe.low_precision else WEIGHT_TOL
        if not any(len(r) for r in ranks):
            self._no_logits(step)
        if any(len(r) and float(r[:, 3].max()) > _SIGNATURE_TOL * tol / WEIGHT_TOL
               for r in ranks):
            if any(len(r) and math.isinf(float(r[:, 3].max())) for r in ranks):
                self._boundary_mixed(step)
            else:
                self._not_cross_entropy(step)
            if held is not None:
                self._report(held)
            return
        finding = classify_window([r[:, :3] for r in ranks], world_size=self.world_size,
                                  averages_over_ranks=self.averages_over_ranks,
                                  accumulation_steps=self.accumulation_steps, step=step,
                                  tol=tol)
        err = token_weight_error([r[:, :3].tolist() for r in ranks], world_size=self.world_size,
                                 averages_over_ranks=self.averages_over_ranks)
        if err is not None:
            self.figures["token_weight_error"] = err
        # A window of one micro-step (one logits forward on every rank) weighted 1/K is a
        # short window scaled as a full one (F7), unless the next window is the same: then
        # the optimizer steps every micro-step (F1). Held one step (the next is probed on
        # every rank: the decision comes from gathered records), said at close if last.
        one = (finding is not None and finding.class_id == "F7"
               and self.accumulation_steps > 1 and all(len(r) == 1 for r in ranks))
        if held is not None:
            if one:
                assert held.step is not None  # the callbacks' findings always carry a step
                self._say_f1(held.step - 1, step)  # (a Finding counts from 1)
                return
            self._report(held)
        if one and self._said_f1:
            return  # the same window of one micro-step: F1's symptom, said once
        if one:
            self._held_f7 = finding
            self._set_probing(True)
            return
        if finding is not None:
            self._report(finding)

    def _say_f1(self, first: int, step: int) -> None:
        if self._said_f1:
            return  # said once: every later window of one micro-step is the same bug
        self._said_f1 = True
        self._report(_finding(step, "F1", f"optimizer steps {first + 1} and {step + 1} each "
                              "followed a single micro-step (one logits forward) whose tokens weighed "
                              f"1/K (accumulation_steps={self.accumulation_steps}): the "
                              "optimizer steps (and zero_grad runs) every micro-step; each "
                              "update is one micro-batch's gradient"))

    def on_unscale(self, event: ScalerEvent) -> None:
        """Observer listener: a GradScaler unscales before this step (its scale is read when
        the probe's records are taken, before ``update`` changes it)."""
        owner = event.owner
        self._scaler = cast("_Scale", owner) if hasattr(owner, "get_scale") else None

    def on_scaler_skip(self, event: ScalerEvent) -> None:
        """Observer listener: a GradScaler skipped this optimizer's step (inf/NaN gradients):
        the window is dropped (its probe records and its scheduler count; a scheduler
        stepped after a skipped step is on time, one step per attempted step)."""
        owner = event.owner
        if owner is not self.optimizer and getattr(owner, "optimizer", None) is not self.optimizer:
            return
        probed = self._probing
        self.probe.discard()
        self._check_scheduler(self.steps - 1)
        self._sched_steps = 0
        # an attempted step: counted as the observer and the frameworks' global_step count it
        # (findings of one window then carry one step number); a sampled window handed its
        # sample to the next one (as the observer's arming does)
        self.steps += 1
        self._set_probing(probed or sampled(self.steps, self.every_n_steps))

    def on_step(self, event: StepEvent) -> None:
        """Observer listener: the boundary contract of a step the observer recorded (a
        sampled window, or one whose hook-free counts are unusual)."""
        self.figures.update(event_figures(event))
        for finding in boundary_findings(event, accumulation_steps=self.accumulation_steps):
            self._report(finding)

    def _check_scheduler(self, step: int) -> None:
        if self.scheduler is None or step < 0 or self._sched_steps <= 1:
            return
        self._report(_finding(step, "F4", f"the LR scheduler stepped {self._sched_steps} times "
                              f"for optimizer step {step + 1} (expected 1; e.g. "
                              "scheduler.step() inside the micro-step loop, or called twice)"))
        self._sched_steps = 0

    def _report(self, finding: Finding) -> None:
        hint = self.fix_hints.get(finding.class_id)
        if hint:
            finding = replace(finding, fix=f"{finding.fix} {hint}")
        self.findings.append(finding)
        if self.on_finding is not None:
            self.on_finding(finding)
        if self.strict:
            raise AccumulationError(f"{rank_prefix(self.rank if self._dist else None)}{finding}")
        if self.rank == 0:
            log.warning("%s", finding)

    def summary(self) -> dict[str, object]:
        """Counts and findings, JSON-friendly (what the callbacks store in trainer state)."""
        return {"steps": self.steps, "checked_steps": self.checked_steps,
                "findings": [callback_dict(f) for f in self.findings]}
