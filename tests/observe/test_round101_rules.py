"""Blind round 101, recorded on 2 gloo ranks:

* DeepSpeed ZeRO-1, ``gradient_accumulation_steps`` 4, ``engine.zero_grad()`` at the top of
  every micro-step (b_b01): ZeRO-0/1 keep the window's gradient in the parameters' ``.grad``
  until the boundary, and the engine's zero_grad sets it to None: F3 (silent before: the
  engine's own zero_grad was not counted). The same call under ZeRO-2 (b_c01, a correct
  script: measured, the update is bit-equal with and without it) stays silent.
* A GRPO loop of K = 4 that skips a micro-step whose groups are all unanimous (c_b02_fixed,
  correct): windows of 3 and 4 backwards, K inferred 3 and no DataLoader pass seen; the
  windows of 4 were called an epoch leak (F7 at error). Without a declared K or a pass over
  the data that is not shown: a note on varying windows."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_engine_zero_grad_inside_a_zero1_window_is_f3() -> None:
    errors = [f for f in judge_recorded("r101_ds_zero1_engine_zero_grad_each_micro_step")
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F3"}, errors
    assert "ZeRO-1" in errors[0].evidence and "sets it to None" in errors[0].evidence


def test_engine_zero_grad_inside_a_zero2_window_is_silent() -> None:
    assert [f for f in judge_recorded("r101_ds_zero2_engine_zero_grad_each_micro_step")
            if f.severity in ("error", "warning")] == []


def test_windows_short_by_a_skipped_micro_step_are_no_leak() -> None:
    found = judge_recorded("r101_skipped_micro_steps_inferred_k")
    assert [f for f in found if f.severity in ("error", "warning")] == [], found
    assert any(f.cls == "F7" and f.severity == "note" for f in found), found


def test_the_returned_optimizers_zero_grad_inside_a_zero1_window_is_f3() -> None:
    """Blind round 123 a_b03: a single-process loop ported to ZeRO-1 keeps its
    ``optimizer.zero_grad()`` before every micro-batch, on the optimizer
    ``deepspeed.initialize`` returned (not the engine's ``zero_grad``): it was not counted, and
    the run said nothing. Recorded on 2 gloo ranks; the twin without the clear is silent."""
    errors = [f for f in judge_recorded("r123_ds_zero1_optimizer_zero_grad_each_micro_step")
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F3"}, errors
    assert "deepspeed.initialize returned" in errors[0].evidence
    assert [f for f in judge_recorded("r123_ds_zero1_no_clear_inside_the_window")
            if f.severity == "error"] == []
