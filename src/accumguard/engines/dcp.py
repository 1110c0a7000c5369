"""What ``torch.distributed.checkpoint`` does to an optimizer, as far as a window is concerned.

``get_state_dict``/``set_state_dict`` (``torch.distributed.checkpoint.state_dict``) give an
optimizer that has no state yet one: every gradient set to zeros, every group's learning rate
set to 0, one ``step()``, then ``zero_grad(set_to_none=True)``. That step holds no micro-batch
and moves nothing; a run rebuilt to resume makes it right after loading, before its first
backward. Counted as a window it would end the window the abandoned run's backward passes
left open and shift every boundary after it.
"""

from __future__ import annotations

import sys

#: frames from the optimizer's pre-step hook up to the caller of ``step()`` (the hook, torch's
#: hook runner, the step's profiling and grad-mode wrappers): searched a little beyond
_CALLER_DEPTH = 12


def is_state_init_step(opt: object) -> bool:
    """``opt.step()`` is the one DCP runs to give a stateless optimizer its state: the
    optimizer holds no state, every group's learning rate is 0, and the step was called by
    ``_init_optim_state`` of ``torch.distributed.checkpoint``. Cheap when not: the frames are
    read only for an optimizer without state whose rates are all 0."""
    if getattr(opt, "state", None):
        return False
    groups = getattr(opt, "param_groups", None) or []
    if not groups:
        return False
    for g in groups:
        lr = g.get("lr", 0.0)
        device = getattr(lr, "device", None)
        if device is not None and device.type != "cpu":
            return False  # (reading a rate on an accelerator would wait for it; DCP's is on the CPU)
        if bool(lr != 0):
            return False
    frame = sys._getframe(1)
    for _ in range(_CALLER_DEPTH):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "_init_optim_state" and "checkpoint" in code.co_filename:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
