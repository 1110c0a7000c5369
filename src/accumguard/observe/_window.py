"""The open window's tally, and the step record it becomes.

The observer fills a :class:`StepTally` as the micro-steps run (the hot path appends to its
lists and bumps its counters) and turns it into the one window record,
:class:`~accumguard.core.window.StepRecord`, at the step (:meth:`StepTally.record`): the
per-backward lists in one pass, nothing read from the model. The tally is mutable and
holds tensors (losses, checksums); the record is frozen and torch-free.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from accumguard.core.window import Conservation, StepRecord
from accumguard.observe._events import BackwardEvent
from accumguard.observe._grad_moments import rescaled
from accumguard.observe._introspect import window_loss

__all__ = ["StepTally"]


class StepTally:
    """What happened since the previous optimizer step, counted as it happens."""

    def __init__(self) -> None:
        self.backwards: list[BackwardEvent] = []
        self.losses: list[torch.Tensor | float] = []  # summed once, at the step (not per backward)
        self.loss_ok = True
        self.zero_grads = 0
        self.zero_between = 0
        self.sched = 0
        self.sched_set = 0  # scheduler steps given an explicit position
        self.clip_micros: list[int] = []
        self.clip_names: list[str] = []
        self.clip_empty: list[list[int]] = []  # clips given no tensor with a gradient
        # clips given parameters that require a gradient and held none yet (a clip before
        # the window's first backward): [backward passes before it, the parameters]
        self.clip_unset: list[tuple[int, list[torch.Tensor]]] = []
        # GradScaler: unscaled yet in this window; the last norm clip before that (max_norm
        # and the returned norm, read at the step); (loss scale, max_norm, norm) of it when
        # an unscale_ followed it: it clipped the scaled gradient
        self.unscaled = False
        self.norm_clip: tuple[object, object] | None = None
        self.scaled_clip: tuple[float, object, object] | tuple[float, object, object, int, int] \
            | None = None
        self.scaler: object = None  # the GradScaler of the window's first unscale_
        self.reductions_between = 0
        self.forwards = 0
        self.engine_step_calls = 0
        self.bw_since_engine_step = 0
        self.engine_bw_since_step = 0  # ... of them through DeepSpeed's engine.backward
        self.max_bw_per_engine_step = 0
        self.starts: list[torch.Tensor] = []  # gradient checksums before each backward
        self.ends: list[torch.Tensor] = []  # ... and after it
        self.zero_since_backward = 0
        self.zero_micros: list[int] = []  # backward passes before each zero_grad counted above
        self.data_passes: list[int] = []  # backward count when a DataLoader pass began
        self.autocast: str | None = None  # autocast dtype at the window's first root forward
        self.autocast_read = False
        # ``_version`` of a few tracked parameters at the window's first backward (an
        # in-place change without an optimizer step then shows at a zero_grad), and how
        # often the window was begun again at such a zero_grad
        self.param_versions: list[int] | None = None
        self.restarts = 0
        # an optimizer's own first window (several optimizers, :mod:`._lanes`): whether its
        # first backward found a nonzero gradient on its parameters (None: not read)
        self.began_on_grad: bool | None = None
        # a DDP comm hook's input: (backward pass, the bucket's sum as a float64 tensor,
        # read at the step)
        self.hook_inputs: list[tuple[int, torch.Tensor]] = []
        # Accelerate: the backwards of each accumulate() block the window's
        # accelerator.backward calls ran in (a block begins where Accelerator.step, which
        # each block moves, changed), and the counter's last value
        self.acc_blocks: list[int] = []
        self.acc_last: object = None
        # the script's post-accumulate-grad hooks: (backward pass, the parameter's gradient
        # moments before and after the hook, on its device until the step; :mod:`._grad_hooks`)
        self.grad_hook_moments: list[tuple[int, torch.Tensor]] = []

    def without_first(self, n: int) -> StepTally:
        """This window less its first ``n`` backward passes: those ran before the stepping
        optimizer was made with no gradient on its parameters (an abandoned model's, in a
        run rebuilt to resume), so none of them is in its gradient."""
        w = StepTally()
        w.backwards = self.backwards[n:]
        if len(self.starts) == len(self.backwards) == len(self.ends):
            w.starts, w.ends = self.starts[n:], self.ends[n:]
        if self.loss_ok and len(self.losses) == len(self.backwards):
            w.losses = self.losses[n:]
        else:
            w.loss_ok = False
        w.zero_micros = [z - n for z in self.zero_micros if z > n]
        w.zero_grads = w.zero_between = len(w.zero_micros)
        w.clip_micros = [c - n for c in self.clip_micros if c >= n]
        w.clip_names = list(self.clip_names)
        w.clip_empty = [[c - n, t] for c, t in self.clip_empty if c >= n]
        w.clip_unset = [(c - n, ps) for c, ps in self.clip_unset if c >= n]
        w.data_passes = [d - n for d in self.data_passes if d >= n]
        w.hook_inputs = [(b - n, t) for b, t in self.hook_inputs if b >= n]
        w.grad_hook_moments = [(b - n, t) for b, t in self.grad_hook_moments if b >= n]
        for name in ("sched", "unscaled", "norm_clip", "scaled_clip", "scaler", "reductions_between",
                     "forwards", "engine_step_calls", "bw_since_engine_step", "engine_bw_since_step",
                     "max_bw_per_engine_step", "autocast", "autocast_read", "param_versions",
                     "restarts"):
            setattr(w, name, getattr(self, name))
        return w

    def unusual(self, window_size: int | None) -> bool:
        """Does a window counted without hooks deserve its record? A bug that shows once per
        epoch (a reset or a new DataLoader pass between backwards, a longer or shorter
        window, a clip before the last backward) is not left to the sampling."""
        n = len(self.backwards)
        return bool(self.zero_between or any(0 < j < n for j in self.data_passes)
                    or any(m < n for m in self.clip_micros)
                    or (window_size is not None and n != window_size))

    def record(self, *, step: int, applied: bool, source: str, optimizer: str, engine: str,
               grad_norm: float | None, conservation: Conservation | None,
               checksum: list[float] | None, wall: float, param_dtype: str | None,
               updates: dict[str, torch.Tensor] | None, losses: list[list[Any]] | None,
               discarded: bool, moved: bool | None = None,
               precision: dict[str, Any] | None = None, param_norm: float | None = None,
               rank_factor: float | None = None, optimizer_index: int | None = None,
               lr_changes: int | None = None, lr: float | None = None,
               terms: list[list[Any]] | None = None,
               in_backward: bool = False, grad_hooks: bool = False,
               backward_pass: int | None = None, opt_serial: int | None = None,
               unborn: int = 0, rank_factor_units: list[list[Any]] | None = None,
               fsdp_mesh: int | None = None,
               unwrapped: list[str] | None = None,
               join_initial: bool | None = None,
               loose_checksum: list[float] | None = None,
               pre_hooked: bool = False,
               lane_scales: list[list[list[Any]]] | None = None) -> StepRecord:
        """The step record of this window (what :mod:`.rules` judges)."""
        loss: float | None = None
        if self.loss_ok and self.backwards:
            loss = window_loss(self.losses)
        syncs: list[bool | None] = []
        mismatch: list[int] = []
        sync_bw: list[bool | None] = []
        forwards: list[int] = []
        boundaries: list[bool | None] = []
        coalescing: list[bool] = []
        micro_ids: list[int | None] = []
        reductions = self.reductions_between
        rounds = 1 if self.reductions_between else 0
        for b in self.backwards:
            fwd, bwd = b.sync_forward, b.sync_backward
            syncs.append(fwd if fwd is not None else bwd)
            if fwd is not None and bwd is not None and fwd != bwd:
                mismatch.append(b.micro)
            sync_bw.append(bwd)
            forwards.append(b.forwards)
            boundaries.append(b.ds_boundary)
            coalescing.append(b.ds_coalescing)
            micro_ids.append(b.ds_micro_id)
            if b.reductions:
                reductions += b.reductions
                rounds += 1
        return StepRecord(
            step=step, backwards=len(self.backwards), window_loss=loss, applied=applied,
            source=source, optimizer=optimizer, engine=engine,
            zero_grads=self.zero_grads, zero_grads_between=self.zero_between,
            scheduler_steps=self.sched, scheduler_positioned=self.sched_set,
            clips=len(self.clip_micros),
            clip_micros=list(self.clip_micros), clip_functions=sorted(set(self.clip_names)),
            data_pass_starts=list(self.data_passes), reductions=reductions,
            reduction_rounds=rounds, sync_micros=syncs, sync_mismatch=mismatch,
            sync_backward=sync_bw, forwards=forwards, ds_boundaries=boundaries,
            ds_coalescing=coalescing, ds_micro_ids=micro_ids if micro_ids.count(None) < len(micro_ids) else [],
            engine_step_calls=self.engine_step_calls,
            max_backwards_per_engine_step=self.max_bw_per_engine_step,
            moved_without_backward=moved if not self.backwards else None,
            grad_norm=grad_norm, conservation=conservation, checksum=checksum, wall=wall,
            param_dtype=param_dtype, updates=dict(updates) if updates is not None else None,
            losses=losses, terms=terms, discarded=discarded, precision=precision,
            param_norm=param_norm,
            rank_factor=rank_factor, optimizer_index=optimizer_index, lr_changes=lr_changes,
            lr=lr, in_backward=in_backward, grad_hooks=grad_hooks,
            backward_pass=backward_pass, clip_before_unscale=self._scaled_clip(),
            restarts=self.restarts, opt_serial=opt_serial, unborn=unborn,
            rank_factor_units=rank_factor_units, fsdp_mesh=fsdp_mesh,
            began_on_grad=self.began_on_grad,
            hook_in=self._hook_in() if self.hook_inputs else None,
            clip_empty=self.clip_empty or None,  # (this tally's own lists: no copy)
            clip_unset=self._clip_unset() if self.clip_unset else None,
            accelerate_blocks=self.acc_blocks or None, unwrapped=unwrapped,
            join_initial=join_initial, loose_checksum=loose_checksum, pre_hooked=pre_hooked,
            grad_rescaled=rescaled(self.grad_hook_moments) if self.grad_hook_moments else None,
            zero_micros=self.zero_micros or None, lane_scales=lane_scales)

    def _clip_unset(self) -> list[int] | None:
        """The backward passes before each clip given parameters that held no gradient then
        and hold one now, at the step (a few read: the clip's parameters went on to be
        trained in this window); None when none did."""
        out = [c for c, ps in self.clip_unset if any(p.grad is not None for p in ps[:16])]
        return out or None

    def _hook_in(self) -> list[list[float]] | None:
        """[backward pass, bucket sum] per comm hook call: one host read for all of them
        (the sums stay on their device until the step)."""
        if not self.hook_inputs:
            return None
        ts = [t.reshape(()) for _, t in self.hook_inputs]
        try:
            sums = torch.stack(ts).tolist()
        except RuntimeError:  # buckets on several devices: one read each
            sums = [float(t) for t in ts]
        return [[float(b), float(x)] for (b, _), x in zip(self.hook_inputs, sums, strict=True)]

    def _scaled_clip(self) -> list[float] | None:
        """[scale, norm, max_norm] of a norm clip of the scaled gradient (one host read of
        the norm, in this rare window only); None when none ran or it was not finite."""
        if self.scaled_clip is None:
            return None
        scale, limit, norm = self.scaled_clip[:3]
        part = [float(x) for x in self.scaled_clip[3:]]  # (still scaled, clipped) parameters
        if not isinstance(limit, int | float) or isinstance(limit, bool):
            return None
        if isinstance(norm, torch.Tensor) and norm.numel() == 1:
            value = float(norm.detach())
        elif isinstance(norm, int | float):
            value = float(norm)
        else:
            return None
        return [scale, value, float(limit), *part] if math.isfinite(value) else None
