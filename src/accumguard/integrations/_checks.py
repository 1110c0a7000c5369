"""The accumulation checks the framework callbacks run (internal to ``integrations``).

**Temporary home.** This is observation-layer work: when ``accumguard.observe``
exposes the same measurements (per-micro-step token weights, scheduler steps per
optimizer step), :class:`TokenWeightProbe`, :class:`AccumulationChecks` and
:func:`classify_window` move there and the callbacks import them from there.

What it measures, without changing a number the loop computes:

* :class:`TokenWeightProbe` hooks the module that produces the logits. For a
  token cross-entropy the gradient of the loss w.r.t. one token's logits row is
  ``s · (softmax(z) − onehot(y))``: its only negative entry sits at the label,
  rows of ignored tokens are zero, and ``s`` is the weight the loop gave each
  token of that micro-batch (``1/N`` when exact). From the gradient and the
  logits it recovers, per micro-step, the valid-token count ``n_i`` and the
  weight ``s_i``: no labels, no knowledge of the loss code, one ``logsumexp``
  and one ``argmin`` over the logits per micro-step.
* :class:`AccumulationChecks` groups those records into windows (an optimizer
  step post-hook ends a window), gathers them over ranks (two small
  all-gathers per step), and :func:`classify_window` names what the optimizer
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

import functools
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from accumguard.core.errors import AccumulationError, ConfigError, rank_prefix
from accumguard.core.taxonomy import fix_for, title
from accumguard.observe.rules import live_findings, step_record

__all__ = ["DEFAULT_EVERY_N_STEPS", "AccumulationChecks", "Finding", "TokenWeightProbe", "boundary_findings",
           "classify_window", "find_logits_module", "unwrap_optimizer", "unwrap_scheduler"]

log = logging.getLogger("accumguard")

# What the callbacks check by default: one optimizer step in 10 (systematic bugs show on every
# step; the sampled steps carry the probe's and the gradient checksums' cost, measured in
# benchmarks/bench_integrations.py). Pass every_n_steps=1 to check every step.
DEFAULT_EVERY_N_STEPS = 10

# Relative spread below which token weights count as equal. The probe is exact up to fp32
# rounding of one logsumexp (~1e-6 relative); real normalisation bugs differ by far more.
WEIGHT_TOL = 1e-3
# With bf16/fp16 logits the gradient itself carries ~3 significant digits.
WEIGHT_TOL_LOW_PRECISION = 3e-2


@dataclass(frozen=True)
class Finding:
    """One accumulation problem seen at optimizer step ``step`` (0-based)."""

    step: int
    class_id: str
    title: str
    evidence: str
    fix: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"accumguard step {self.step}: {self.class_id} {self.title}: {self.evidence}. Fix: {self.fix}"


def _finding(step: int, class_id: str, evidence: str) -> Finding:
    return Finding(step=step, class_id=class_id, title=title(class_id), evidence=evidence,
                   fix=fix_for(class_id))


def find_logits_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output is the logits: a transformers model's output embeddings
    (``lm_head``), searched through wrappers (DDP, a LightningModule holding a model), else
    the last ``nn.Linear`` registered in ``model``."""
    for m in model.modules():
        get = getattr(m, "get_output_embeddings", None)
        if callable(get):
            out = get()
            if isinstance(out, torch.nn.Module):
                return out
    last = None
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            last = m
    if last is None:
        raise ConfigError(
            f"found no module producing logits in {type(model).__name__} (no "
            "get_output_embeddings(), no nn.Linear); pass logits_module=<the output layer>")
    return last


def unwrap_optimizer(opt: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` or Lightning's
    ``LightningOptimizer`` (hooks must sit on the object that really steps)."""
    for attr in ("optimizer", "_optimizer"):
        inner = getattr(opt, attr, None)
        if isinstance(inner, torch.optim.Optimizer):
            return inner
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(f"expected a torch optimizer (or a framework wrapper of one), got "
                          f"{type(opt).__name__}")
    return opt


def unwrap_scheduler(sched: Any) -> Any:
    """The torch LR scheduler inside Accelerate's ``AcceleratedScheduler`` (which steps its
    inner scheduler ``num_processes`` times per optimizer step unless ``split_batches``)."""
    inner = getattr(sched, "scheduler", None)
    return inner if inner is not None and hasattr(inner, "step") else sched


class TokenWeightProbe:
    """Per micro-step ``(valid tokens, Σ token weight·(1−p_y), Σ (1−p_y))`` from dL/dlogits.

    The ratio of the last two is the weight ``s_i`` the loss gave each token of the
    micro-batch; see the module docstring. Records accumulate in :attr:`records` until
    :meth:`take` collects them.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.records: list[torch.Tensor] = []
        self.scale = 1.0  # multiplies the weights of records taken next (set by exact paths)
        self.active = True  # off on steps that are not checked: no cost there
        self.low_precision = False  # a bf16/fp16 logits gradient was seen
        self._handle = module.register_forward_hook(self._on_forward)

    def close(self) -> None:
        self._handle.remove()

    def _on_forward(self, module: Any, args: Any, output: Any) -> None:
        logits = output
        if not isinstance(logits, torch.Tensor):
            logits = getattr(output, "logits", None)
        if (not self.active or not isinstance(logits, torch.Tensor) or not logits.requires_grad
                or not torch.is_grad_enabled()):
            return
        logits.register_hook(  # type: ignore[no-untyped-call]
            functools.partial(self._on_grad, logits.detach()))

    def _on_grad(self, logits: torch.Tensor, grad: torch.Tensor) -> None:
        # Few, fused ops: this runs once per micro-step on a [tokens, vocab] tensor.
        with torch.no_grad():
            v = grad.shape[-1]
            g = grad.reshape(-1, v)
            if g.dtype not in (torch.float32, torch.float64):
                self.low_precision = True
                g = g.float()  # bf16/fp16 logits: judge in fp32, the tolerance assumes it
            gy, y = g.min(dim=-1)  # the label's entry: s·(p_y − 1) < 0
            valid = (gy < 0).to(gy.dtype)  # ignored tokens have an all-zero row
            z = logits.reshape(-1, v).to(gy.dtype)
            log_p = z.gather(-1, y.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
            one_minus_p = -torch.expm1(log_p)
            # Σ over valid tokens of s·(1 − p_y), Σ (1 − p_y), and the count (gy is 0 off them)
            self.records.append(torch.stack([valid.sum(), -gy.sum(),
                                             torch.dot(one_minus_p, valid)]))

    def take(self) -> torch.Tensor:
        """The records since the last call, as an ``[m, 3]`` float64 tensor (weights scaled)."""
        recs = (torch.stack(self.records).to("cpu", torch.float64) if self.records
                else torch.zeros(0, 3, dtype=torch.float64))
        self.records = []
        if self.scale != 1.0 and len(recs):
            recs[:, 1] *= self.scale
        self.scale = 1.0
        return recs


def classify_window(ranks: list[torch.Tensor], *, world_size: int, averages_over_ranks: bool,
                    accumulation_steps: int, step: int, tol: float = WEIGHT_TOL
                    ) -> Finding | None:
    """Name what the optimizer received from the probe records of one window.

    ``ranks[r]`` is rank r's ``[m, 3]`` records. Returns ``None`` when every valid token
    carried the weight ``1/N`` (or when there is nothing to judge).
    """
    rows = [(r, i, float(n), float(num), float(den)) for r, recs in enumerate(ranks)
            for i, (n, num, den) in enumerate(recs.tolist())]
    rows = [x for x in rows if x[2] > 0 and x[4] > 0]
    if not rows:
        return None
    total = sum(x[2] for x in rows)
    avg = 1.0 / world_size if averages_over_ranks else 1.0
    # w: the weight one token of micro-step i finally carries; exact means w * total == 1.
    ratio = [x[3] / x[4] * avg * total for x in rows]
    counts = [x[2] for x in rows]

    def flat(vals: list[float]) -> bool:
        lo, hi = min(vals), max(vals)
        return hi > 0 and (hi - lo) <= tol * hi

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= tol * abs(b)

    lo, hi = min(ratio), max(ratio)
    if near(lo, 1.0) and near(hi, 1.0):
        return None
    per_micro = [r * n / total for r, n in zip(ratio, counts, strict=True)]  # w_i * n_i
    micro_steps = max(len(recs) for recs in ranks)
    seen = (f"micro-steps with {min(counts):g}..{max(counts):g} valid tokens (N={total:g} over "
            f"{len(rows)} micro-batches on {world_size} rank(s)) gave their tokens weights from "
            f"{lo:.4g}/N to {hi:.4g}/N; exact is 1/N for every token")
    if flat(ratio):
        r = (lo + hi) / 2
        if world_size > 1 and (near(r, world_size) or near(r, 1.0 / world_size)):
            return _finding(step, "F10", f"{seen}: every weight is {r:.4g}/N, off by the world "
                            f"size {world_size}")
        if micro_steps < accumulation_steps and near(r, micro_steps / accumulation_steps):
            return _finding(step, "F7", f"{seen}: a partial window of {micro_steps} of "
                            f"{accumulation_steps} micro-steps normalised as a full one")
        return _finding(step, "LOSS_SCALE", f"{seen}: every weight is {r:.4g}/N")
    if flat(per_micro):
        c = sum(per_micro) / len(per_micro)
        return _finding(step, "F5", f"{seen}; each micro-step's tokens got the same total weight "
                        f"({c:.4g}) whatever their count, i.e. a per-micro-batch mean "
                        f"(total weight {c * len(rows):.4g}, exact 1)")
    by_rank: dict[int, list[int]] = {}
    for j, x in enumerate(rows):
        by_rank.setdefault(x[0], []).append(j)
    if len(by_rank) > 1 and all(flat([ratio[j] for j in js]) for js in by_rank.values()):
        rank_mass = [sum(per_micro[j] for j in js) for js in by_rank.values()]
        if flat(rank_mass):
            return _finding(step, "F6", f"{seen}; each rank's tokens got the same total weight "
                            "whatever the rank's count, i.e. a mean over ranks of rank-local "
                            "means")
    return _finding(step, "LOSS_SCALE", seen)


def boundary_findings(event: Any, *, accumulation_steps: int) -> list[Finding]:
    """Error-level findings from one :class:`accumguard.observe.StepEvent` (what the
    observer saw between two optimizer steps on this rank), by the per-window rules of
    :func:`accumguard.observe.rules.live_findings` (the rules ``accumguard watch`` runs)."""
    record = step_record(event, 0)
    return [_finding(int(event.step), f.cls, f.evidence)
            for f in live_findings(record, rank=None, k=accumulation_steps)
            if f.severity == "error"]


class AccumulationChecks:
    """Probe + optimizer/scheduler hooks; findings after every (``every_n_steps``-th) step.

    Args:
        model: the model (or wrapper) whose logits are probed.
        optimizer: the optimizer (framework wrappers are unwrapped).
        accumulation_steps: K, micro-steps per optimizer step and rank.
        scheduler: LR scheduler whose steps are counted (wrappers unwrapped); optional.
        averages_over_ranks: the gradient reduction divides by the world size (DDP,
            FSDP2, Accelerate, Lightning DDP); default: True on more than one rank.
        logits_module: the layer producing logits (default: :func:`find_logits_module`).
        every_n_steps: check one step in n (the scheduler count is checked every step); the
            probe and the observer's gradient checksums cost nothing on the other steps.
        strict: raise :class:`~accumguard.core.errors.AccumulationError` on a finding
            instead of logging it.
        on_finding: called with every :class:`Finding`.
        observe: also run the observation layer (:class:`accumguard.observe.Observer`,
            rooted at ``model``) for the boundary contract; see :func:`boundary_findings`.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, *, accumulation_steps: int,
                 scheduler: Any = None, averages_over_ranks: bool | None = None,
                 logits_module: torch.nn.Module | None = None, every_n_steps: int = 1,
                 strict: bool = False, on_finding: Callable[[Finding], None] | None = None,
                 process_group: Any = None, observe: bool = True) -> None:
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
        self.steps = 0
        self.checked_steps = 0
        self.probe = TokenWeightProbe(logits_module or find_logits_module(model))
        self.optimizer = unwrap_optimizer(optimizer)
        self._step_handle = self.optimizer.register_step_post_hook(self._after_step)
        self.scheduler = unwrap_scheduler(scheduler) if scheduler is not None else None
        self._sched_steps = 0
        self._sched_had_attr = False
        if self.scheduler is not None:
            self._sched_had_attr = "step" in vars(self.scheduler)
            previous = self.scheduler.step

            @functools.wraps(previous)
            def counted_step(*args: Any, **kwargs: Any) -> Any:
                self._sched_steps += 1
                return previous(*args, **kwargs)

            self._sched_previous = previous
            self.scheduler.step = counted_step
        self.observer: Any = None
        if observe:
            from accumguard.observe import Observer

            self.observer = Observer(roots=[model], conservation=True, every=every_n_steps)
            self.observer.add_listener(self)
            self.observer.install()

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Check the last step's scheduler count, remove every hook, restore the scheduler."""
        if self.probe is None:
            return
        self._check_scheduler(self.steps - 1)
        if self.observer is not None:
            self.observer.uninstall()
            self.observer = None
        self.probe.close()
        self._step_handle.remove()
        if self.scheduler is not None:
            if self._sched_had_attr:
                self.scheduler.step = self._sched_previous
            else:
                del self.scheduler.step
        self.probe = None  # type: ignore[assignment]

    def __enter__(self) -> AccumulationChecks:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def scale_next_window(self, factor: float) -> None:
        """An exact path rescales the accumulated gradient by ``factor`` at the boundary
        (after the micro-steps' backwards): account for it in this window's weights."""
        self.probe.scale = factor

    # -- per step ---------------------------------------------------------------------
    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        step = self.steps
        self.steps += 1
        if step > 0:
            self._check_scheduler(step - 1)
        self._sched_steps = 0
        recs = self.probe.take()
        self.probe.active = self.steps % self.every_n_steps == 0  # the next step is checked?
        if step % self.every_n_steps:
            return
        ranks = self._gather(recs)
        self.checked_steps += 1
        finding = classify_window(ranks, world_size=self.world_size,
                                  averages_over_ranks=self.averages_over_ranks,
                                  accumulation_steps=self.accumulation_steps, step=step,
                                  tol=WEIGHT_TOL_LOW_PRECISION if self.probe.low_precision
                                  else WEIGHT_TOL)
        if finding is not None:
            self._report(finding)

    def on_step(self, event: Any) -> None:
        """Observer listener: the boundary contract of the step that just ended."""
        for finding in boundary_findings(event, accumulation_steps=self.accumulation_steps):
            self._report(finding)

    def _check_scheduler(self, step: int) -> None:
        if self.scheduler is None or step < 0 or self._sched_steps <= 1:
            return
        self._report(_finding(step, "F4", f"the LR scheduler stepped {self._sched_steps} times "
                              "for one optimizer step (expected 1; Accelerate's prepared "
                              "scheduler steps num_processes times unless split_batches=True)"))
        self._sched_steps = 0

    def _gather(self, recs: torch.Tensor) -> list[torch.Tensor]:
        if self.world_size == 1:
            return [recs]
        dist = torch.distributed
        m = torch.tensor([float(len(recs))], dtype=torch.float64)
        ms = [torch.zeros_like(m) for _ in range(self.world_size)]
        dist.all_gather(ms, m, group=self.group)
        top = int(max(x.item() for x in ms))
        padded = torch.zeros(top, 3, dtype=torch.float64)
        padded[: len(recs)] = recs
        out = [torch.zeros_like(padded) for _ in range(self.world_size)]
        dist.all_gather(out, padded, group=self.group)
        return [o[: int(n.item())] for o, n in zip(out, ms, strict=True)]

    def _report(self, finding: Finding) -> None:
        self.findings.append(finding)
        if self.on_finding is not None:
            self.on_finding(finding)
        if self.strict:
            raise AccumulationError(f"{rank_prefix(self.rank if self._dist else None)}{finding}")
        if self.rank == 0:
            log.warning("%s", finding)

    def summary(self) -> dict[str, Any]:
        """Counts and findings, JSON-friendly (what the callbacks store in trainer state)."""
        return {"steps": self.steps, "checked_steps": self.checked_steps,
                "findings": [f.as_dict() for f in self.findings]}
