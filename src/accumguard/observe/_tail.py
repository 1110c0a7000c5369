"""The rest of a run after observation ended (``observe_steps``): counted, not observed.

A schedule's horizon is judged against the optimizer steps the whole run makes, and an
epoch's length against the whole pass (:mod:`._schedules`). Once the observer has left the
process (:meth:`~._failsafe.Failsafe.retire`), three counters stay, each one integer
increment in a call that happens once per micro-step, window or epoch: outermost optimizer
steps (torch's global step hooks; per optimizer), backward passes (outermost
``torch.autograd.backward``, which ``Tensor.backward`` and the engines' backward call), and
the backward count at each new DataLoader pass; and each LR scheduler's position after its
steps (its horizon read once). Nothing here reads a tensor; nothing can raise into the
caller (an increment, a list append, attribute reads behind a ``try``).
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from accumguard.observe import _schedules
from accumguard.observe._tally import Tally

__all__ = ["Tail"]


class Tail:
    """Counters installed after observation ended; ``remove()`` takes them out."""

    def __init__(self, known: list[object] | None = None) -> None:
        # the optimizers observation saw step: a step by any other (a new phase, a model
        # rebuilt to resume) is counted apart, so the report can say it went unobserved
        self._known = [weakref.ref(o) for o in known or []]
        self.new_steps = 0
        self.steps = 0  # outermost optimizer steps
        self.per_optimizer = Tally()
        self.backwards = 0
        self.backwards_at_step = 0  # backward passes when the last step ended
        self.passes: list[int] = []  # backward passes counted when each DataLoader pass began
        # per scheduler object: its state after its last step (position, stated horizon,
        # the optimizer steps then): read at the step, as the object may be gone at the end
        self.scheds: dict[int, dict[str, Any]] = {}
        self._opt_depth = 0
        self._bw_depth = 0
        self._undo: list[Callable[[], None]] = []

    def install(self) -> Tail:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._undo.append(register_optimizer_step_pre_hook(self._pre).remove)
        self._undo.append(register_optimizer_step_post_hook(self._post).remove)
        self._wrap(torch.autograd, "backward", self._backward)
        self._wrap(torch.utils.data.DataLoader, "__iter__", self._data_pass)
        lr = torch.optim.lr_scheduler
        for cls in [lr.LRScheduler, *(c for c in vars(lr).values() if isinstance(c, type)
                                      and issubclass(c, lr.LRScheduler)
                                      and c is not lr.LRScheduler and "step" in vars(c))]:
            self._wrap(cls, "step", self._sched_step)
        ds = sys.modules.get("deepspeed.runtime.lr_schedules")
        for cls in _schedules.deepspeed_schedulers(ds) if ds is not None else []:
            self._wrap(cls, "step", self._sched_step)
        return self

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        wrapper = functools.wraps(orig)(make(orig))
        setattr(owner, name, wrapper)

        def undo() -> None:
            if getattr(owner, name, None) is wrapper:  # (unless someone wrapped it since)
                setattr(owner, name, orig)

        self._undo.append(undo)

    def _pre(self, opt: object, args: object, kwargs: object) -> None:
        self._opt_depth += 1

    def _post(self, opt: object, args: object, kwargs: object) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if not self._opt_depth:  # an optimizer stepping an inner one is one step
            self.steps += 1
            self.backwards_at_step = self.backwards
            self.per_optimizer.add(opt)
            if not any(ref() is opt for ref in self._known):
                self.new_steps += 1

    def _backward(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if self._bw_depth:
                return orig(*args, **kwargs)
            self.backwards += 1
            self._bw_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                self._bw_depth -= 1

        return backward

    def _data_pass(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def __iter__(loader: Any) -> Any:  # noqa: N807 - the wrapped dunder
            if torch.is_grad_enabled():
                self.passes.append(self.backwards)
            return orig(loader)

        return __iter__

    def _sched_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig(sched, *args, **kwargs)
            try:  # a scheduler's own attributes only; never into the caller
                known = self.scheds.get(id(sched))
                pos = getattr(sched, "last_epoch", None)
                if pos is None:  # DeepSpeed's schedulers
                    pos = _schedules.position(sched)
                if known is None or known["ref"]() is not sched:
                    # (read through the module: the fault tests replace it there)
                    known = self.scheds[id(sched)] = {"ref": weakref.ref(sched),
                                                     **_schedules.schedule_state(sched)}
                opt = getattr(sched, "optimizer", None)
                known.update(pos=pos, at=self.steps,
                             own=self.per_optimizer.get(opt) if opt is not None else self.steps,
                             opt=id(opt))
            except Exception:  # noqa: BLE001 - a state lost, never the user's step
                self.scheds.pop(id(sched), None)  # (a stale one is not its final state)
            return out

        return step

    def record(self, optimizer_steps: Callable[[int], int], steps_before: int
               ) -> dict[str, Any]:
        """The ``tail`` record: the counts, and each scheduler's state after its last step
        (``optimizer_steps(id of its optimizer)``: that optimizer's observed steps, added to
        the ones counted here)."""
        scheds = []
        for known in self.scheds.values():
            fields = {k: v for k, v in known.items() if k not in ("ref", "at", "own", "opt")}
            if not isinstance(fields.get("pos"), int):
                continue
            scheds.append({"kind": "scheduler", "step": steps_before + int(known["at"]),
                           "micro": 0, "in_step": bool(self._opt_depth), "final": True,
                           "optimizer_steps": optimizer_steps(int(known["opt"]))
                           + int(known["own"]), **fields})
        return {"kind": "tail", "steps": self.steps, "new_optimizer_steps": self.new_steps,
                "backwards": self.backwards,
                "pending_backwards": self.backwards - self.backwards_at_step,
                "passes": list(self.passes), "schedulers": scheds}
