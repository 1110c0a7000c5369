"""Epochs in the window rules, on recorded windows (in-process): every epoch shorter than K
(Lightning steps at each epoch's end and divides every batch by K: F7 error with the
weights; a note when the weights are right), no F13 for short windows that close an epoch,
and an epoch tail cleared by the next epoch's zero_grad (a warning when the next step is a
whole window: data skipped, update right; an error when that step is short too)."""

from __future__ import annotations

from accumguard.observe._epochs import dropped_finding, short_epoch_findings
from accumguard.observe._records import KResolution, StepWindow
from accumguard.observe._records import windows as fold
from accumguard.observe.rules import _window_findings


def _window(step: int, n: int, weight: float, start: bool = True) -> StepWindow:
    # a loss record per micro-step: [site, call, micro, valid count, weight per token, low
    # precision, reduction, sole, via autograd.grad]
    losses = [["/x/train.py:33", 0, m, 4, weight, False, "mean", True, False] for m in range(n)]
    return fold([{"step": step, "backwards": n, "data_pass_starts": [0] if start else [],
                  "zero_grads_between": 0, "losses": losses}])[0]


def test_every_epoch_shorter_than_k_divided_by_k_is_f7() -> None:
    # 3 batches per epoch, K = 4, each batch's mean divided by 4: weight 1/(4*4) per token
    windows = [_window(i, 3, 1 / 16) for i in range(5)]
    found = short_epoch_findings(0, windows, 4, True, "declared by lightning")
    assert [(f.cls, f.severity) for f in found] == [("F7", "error")], found
    assert "0.75 = 3/4" in found[0].evidence and "accumulate_grad_batches" in found[0].fix
    # each short window normalised by its own 3: right, only a note on the batch size
    right = [_window(i, 3, 1 / 12) for i in range(5)]
    assert [(f.cls, f.severity) for f in short_epoch_findings(0, right, 4, True, "x")] == [
        ("F7", "note")]
    # K inferred (nothing declared): never an error
    assert all(f.severity != "error" for f in short_epoch_findings(0, windows, 4, False, "x"))
    # windows that do not each close a pass: not this rule
    mixed = [_window(i, 3, 1 / 16, start=i % 2 == 0) for i in range(4)]
    assert short_epoch_findings(0, mixed, 4, True, "x") == []


def _unrecorded(step: int, n: int) -> StepWindow:
    """A window whose loss was built by hand (no recorded loss call: no weights)."""
    return fold([{"step": step, "backwards": n, "data_pass_starts": [0],
                  "zero_grads_between": 0}])[0]


def test_lightning_short_epochs_with_a_loss_built_by_hand_are_f7() -> None:
    """No loss weights recorded (``((net(x) - y) ** 2).mean()``), K from the Lightning
    Trainer's accumulate_grad_batches: its automatic optimisation divides every batch's loss
    by K, the short last window too, so each update is n/K of the window's mean: an error.
    K declared by another library, or by the script, with no weights: only the note."""
    windows = [_unrecorded(i, 3) for i in range(4)]
    found = short_epoch_findings(0, windows, 4, True, "declared by lightning")
    assert [(f.cls, f.severity) for f in found] == [("F7", "error")], found
    assert "accumulate_grad_batches = 4" in found[0].evidence, found[0].evidence
    assert "3/4 of the window's mean gradient" in found[0].evidence, found[0].evidence
    for source in ("declared by transformers", "declared in the script (train.py:3)"):
        assert [(f.cls, f.severity) for f in short_epoch_findings(0, windows, 4, True,
                                                                   source)] == [("F7", "note")]


def test_short_windows_closing_epochs_are_not_f13() -> None:
    windows = [_window(i, 3, 1 / 16) for i in range(5)]
    res = KResolution(4, "declared by lightning", "runtime")
    assert not [f for f in _window_findings(0, windows, {}, res) if f.cls == "F13"]
    # the same windows of K - 1 inside one pass: the counter is off (F13)
    inside = [_window(i, 3, 1 / 16, start=i == 0) for i in range(5)]
    assert [f.cls for f in _window_findings(0, inside, {}, res)] == ["F13"]


def _wiped(n: int, j: int) -> StepWindow:
    return fold([{"step": 2, "backwards": n, "data_pass_starts": [j], "zero_grads_between": 1,
                  "conservation": {"params": 2, "ok": False, "reason": "wiped",
                                   "first_wipe": j, "wiped": 0.05, "stale": 0.0,
                                   "received": 0.05}}])[0]


def test_a_dropped_tail_is_a_warning_when_the_next_window_is_whole() -> None:
    f = dropped_finding(0, _wiped(6, 2), 2, 4)
    assert (f.cls, f.severity) == ("F7", "warning") and "never trained on" in f.evidence
    # a counter running across epochs: the step after the clear had 2 micro-steps, not 4
    g = dropped_finding(0, _wiped(4, 2), 2, 4)
    assert (g.cls, g.severity) == ("F7", "error") and "not K = 4" in g.evidence


def test_epoch_counts_with_scheduler_steps_and_the_unstepped_tail() -> None:
    from accumguard.observe._epochs import complete_epochs, epochs

    # 2 passes of 6 micro-batches, K = 4, each tail cleared: windows of 4 and (2 + 4);
    # the last pass's 2 trailing micro-batches were never stepped (pending)
    steps = [{"step": 0, "backwards": 4, "data_pass_starts": [0]},
             {"step": 1, "backwards": 6, "data_pass_starts": [2]}]
    scheds = [{"step": 1, "micro": 0}, {"step": 2, "micro": 0}]
    eps = epochs(steps, scheds, pending=2)
    assert [e.as_dict() for e in eps] == [
        {"micro_batches": 6, "optimizer_steps": 1, "scheduler_steps": 1, "windows": [4]},
        {"micro_batches": 6, "optimizer_steps": 1, "scheduler_steps": 1, "windows": [4]}]
    assert complete_epochs(steps, 2) and not complete_epochs(steps, 0)


def test_an_unchecked_window_across_passes_with_a_reset_is_not_called_a_leak() -> None:
    # windows of 4, then one of 6 spanning two DataLoader passes (2 left + 4 new)
    res = KResolution(4, "declared in the script", "script")
    whole = [{"step": i, "backwards": 4, "window": 4, "data_pass_starts": [0] if i == 0 else [],
              "zero_grads_between": 0} for i in range(2)]
    span = {"step": 2, "backwards": 6, "window": 6, "data_pass_starts": [2],
            "zero_grads_between": 1, "conservation": None}
    found = [(f.cls, f.severity) for f in _window_findings(0, fold(whole + [span]), {}, res)]
    # a zero_grad inside, the gradient not checked (sampled out): dropped or leaked, unclaimed
    assert found == [("F7", "warning")], found
    # no zero_grad inside it: the tail leaked into the next epoch's window (an error)
    leak = dict(span, zero_grads_between=0)
    assert [(f.cls, f.severity) for f in _window_findings(0, fold([*whole, leak]), {}, res)] == [
        ("F7", "error")]
