"""A loop that moves each micro-step's gradient out of ``.grad`` into a buffer of its own and
gives the buffer back at the step (blind round 115 a_b02: a ``GradFolder`` helper): the
window's gradient reaches the optimizer whole. Before, conservation read the moves as a
clear (F3, "the earlier micro-batches do not reach the optimizer in full") whenever the
buffer's bf16 rounding put the received gradient 0.2 % off the exact sum. It is now a
"returned" window: no F3, and an F12 warning saying the sum came back rounded. The writer's
"fixed" twin gives the buffer back as the same tensor and then zeroes it (``b.to(p.dtype)``
is ``b`` itself in fp32): the optimizer receives nothing, and F3 stays."""

from __future__ import annotations

import torch

from accumguard.observe._checksum import conservation
from tests.helpers import judge_recorded


def _moved_out(noise: float, lost: float = 0.0) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    parts = [torch.rand(6, 3, generator=gen, dtype=torch.float64) for _ in range(4)]
    starts = [torch.zeros(6, 3, dtype=torch.float64) for _ in parts]  # .grad emptied each time
    ends = list(parts)
    total = sum(parts[1:], torch.zeros(6, 3, dtype=torch.float64)) * (1 - lost) + parts[0]
    received = total * (1 + noise * torch.randn(6, 3, generator=gen, dtype=torch.float64))
    return starts, ends, received


def test_a_gradient_moved_out_and_returned_rounded_is_conserved() -> None:
    starts, ends, received = _moved_out(2e-3)
    cons = conservation(starts=starts, ends=ends, received=received, tol=1e-3)
    assert cons.ok and cons.reason == "returned", cons
    assert 1e-3 < cons.received < 3e-2


def test_a_gradient_moved_out_and_partly_lost_is_wiped() -> None:
    starts, ends, received = _moved_out(0.0, lost=0.5)
    cons = conservation(starts=starts, ends=ends, received=received, tol=1e-3)
    assert not cons.ok and cons.reason == "wiped", cons


def test_the_bf16_buffer_is_an_f12_warning_not_f3() -> None:
    found = judge_recorded("r115_grad_folder_bf16_buffer")
    assert not [f for f in found if f.cls == "F3"], found
    f12 = [f for f in found if f.cls == "F12"]
    assert f12 and all(f.severity == "warning" for f in f12), found
    assert "came back at the optimizer step" in f12[0].evidence


def test_a_buffer_zeroed_after_it_was_given_back_is_f3() -> None:
    errors = [f for f in judge_recorded("r115_grad_folder_buffer_zeroed_after_release")
              if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F3"}, errors


def test_a_clip_after_every_micro_step_is_f8_not_a_rounded_buffer() -> None:
    """Blind round 121 c_b02: Fabric's ``clip_gradients`` after every micro-step rescales the
    summed ``.grad`` between the backwards; conservation reads those windows as "returned"
    off the exact sum. That is the clip's doing (F8), not a low-precision buffer: no F12."""
    found = judge_recorded("r121_fabric_clip_every_micro_step")
    assert {(f.cls, f.severity) for f in found if f.severity == "error"} == {("F8", "error")}, found
    assert not [f for f in found if f.cls == "F12"], found
