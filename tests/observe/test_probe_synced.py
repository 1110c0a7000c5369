"""A backward before training (a compile warm-up) whose gradient reaches the first optimizer
step, on a compiled nanoGPT-style DDP model (blind round 110 c_b02, recorded on 2 gloo
ranks): the compiled model's loss is not recorded, so no call site tells the warm-up from the
loop; DDP's sync flags do. The warm-up backward all-reduced, and the loop's windows never
sync a first backward: F7 at error. The twin that clears the gradient after the warm-up has
no error, and a loop that syncs every backward proves nothing."""

from __future__ import annotations

from dataclasses import replace

from accumguard.observe._probe_rules import probe_before_first_window
from accumguard.observe._records import _windows
from accumguard.watch._findings import load_recordings

from helpers import RECORDED, judge_recorded


def test_compile_warm_up_backward_leaking_into_step_one_is_f7() -> None:
    found = [(f.cls, f.severity.value, f.rank, f.step) for f in
             judge_recorded("r110_compile_warmup_backward_leaks") if f.severity.value == "error"]
    assert found == [("F7", "error", 0, 1), ("F7", "error", 1, 1)], found
    (f, *_) = [f for f in judge_recorded("r110_compile_warmup_backward_leaks") if f.cls == "F7"]
    assert "all-reduced (sync on) before the loop's first micro-step" in f.evidence
    assert "zero_grad" in f.fix


def test_the_cleared_twin_has_no_error() -> None:
    errors = [f for f in judge_recorded("r110_compile_warmup_backward_cleared")
              if f.severity.value == "error"]
    assert errors == [], errors


def test_a_loop_that_syncs_every_backward_proves_nothing() -> None:
    rec = load_recordings(RECORDED / "r110_compile_warmup_backward_leaks")
    windows = _windows(rec.steps[0])
    assert probe_before_first_window(0, windows, 4) is not None
    synced = [replace(w, sync_micros=[True] * int(w.window)) for w in windows]
    assert probe_before_first_window(0, synced, 4) is None
