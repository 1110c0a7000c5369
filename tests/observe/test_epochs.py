"""Epochs in the window rules, on recorded windows (in-process): every epoch shorter than K
(Lightning steps at each epoch's end and divides every batch by K: F7 error with the
weights; a note when the weights are right), no F13 for short windows that close an epoch,
and an epoch tail cleared by the next epoch's zero_grad (a warning when the next step is a
whole window: data skipped, update right; an error when that step is short too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumguard.observe import _losses
from accumguard.observe._epochs import dropped_finding, short_epoch_findings
from accumguard.observe._records import Finding, KResolution, RunRecording, StepWindow
from accumguard.observe._records import windows as fold
from accumguard.observe._size_rules import window_findings as _window_findings
from accumguard.observe.rules import analyze, resolve_k
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording


@pytest.fixture(autouse=True)
def _record_every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every window's loss record (a toy's windows are cheap: the time budget would skip
    some; the budget has its own test)."""
    monkeypatch.setattr(_losses, "_ALWAYS", 10_000)


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


# -- epochs shorter than a K the script declares, and an epoch's short tail, recorded in
# process (the engine does not matter: a plain loop over a DataLoader) --------------------

class _ScriptK:
    """A K the script's source declares (what ``watch._declared`` finds: a config field)."""

    def __init__(self, value: int) -> None:
        self.value, self.divides_loss, self.where = value, True, "train.py:7"

    def describe(self) -> str:
        return f"grad_accum_steps = {self.value} declared in the script (train.py:7)"


def _epoch_run(tmp: Path, *, k: int, batches: int, how: str, loss: str,
               epochs: int = 3) -> list[torch.Tensor]:
    """The brief's loop: ``loss = crit(model(x), y) / K; loss.backward()``, a step every K
    and at each epoch's end. ``how``: 'k' divides by K (the bug), 'own' by the window's real
    length ``min(K, remaining)``, 'rescale' by K and multiplies a short window's gradient
    by K / its length before the step (right too). ``loss``: 'hand' (``((out - y) ** 2).mean()``, no loss
    call recorded) or 'mse' (``nn.MSELoss``). Returns the final parameters."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(4 * batches, 8, generator=g),
                                          torch.randn(4 * batches, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    crit = torch.nn.MSELoss()
    with recording(tmp) as obs:
        obs.budget = None  # conservation checked on every window (a toy: the budget skips)
        for _ in range(epochs):
            for i, (x, y) in enumerate(loader):
                out = model(x)
                if loss == "weighted":  # per-sample weights from the data (min-SNR style)
                    per = torch.nn.functional.mse_loss(out, y, reduction="none").mean(dim=1)
                    value = (per * (1.0 + y.detach().abs().squeeze(1))).mean()
                else:
                    value = ((out - y) ** 2).mean() if loss == "hand" else crit(out, y)
                size = min(k, len(loader) - (i - i % k))
                (value / (size if how == "own" else k)).backward()
                if (i + 1) % k == 0 or i + 1 == len(loader):
                    if how == "rescale" and size < k:  # divided by K, then fixed at the step
                        for p in model.parameters():
                            p.grad.mul_(k / size)  # type: ignore[union-attr]
                    opt.step()
                    opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _judge(tmp: Path, k: int) -> tuple[list[Finding], int | None]:
    found, resolved, _ = analyze(load_recordings(tmp), script=_ScriptK(k))
    return found, resolved


@pytest.mark.parametrize("loss", ["hand", "mse"])
def test_every_epoch_shorter_than_a_script_k_divided_by_k_is_f7(tmp_path: Path,
                                                                 loss: str) -> None:
    """6 micro-batches per epoch, K = 8 read from the script, each divided by 8: every step
    is a short window weighing 6/8 (F7 error, K the declared 8, not the inferred 6), with
    a loss built by hand too (its divisor read from the autograd graph)."""
    _epoch_run(tmp_path, k=8, batches=6, how="k", loss=loss)
    found, k = _judge(tmp_path, 8)
    assert k == 8
    errors = [f for f in found if f.severity == "error"]
    assert [(f.cls, f.step) for f in errors] == [("F7", 1)], found
    assert "0.75 = 6/8" in errors[0].evidence and "fewer than K = 8" in errors[0].evidence
    if loss == "hand":
        assert "built by hand" in errors[0].evidence and "divided by 8" in errors[0].evidence
    assert not [f for f in found if f.cls == "F13"], found


@pytest.mark.parametrize("loss", ["hand", "mse"])
def test_every_epoch_shorter_than_k_normalised_by_its_own_length_is_no_error(
        tmp_path: Path, loss: str) -> None:
    """The twin dividing by ``min(K, remaining)``: each step is its epoch's mean; a note
    says so (measured) and that the effective batch is 6, not 8."""
    _epoch_run(tmp_path, k=8, batches=6, how="own", loss=loss)
    found, k = _judge(tmp_path, 8)
    assert k == 8 and not [f for f in found if f.severity != "note"], found
    assert [f.cls for f in found] == ["F7"] and "measured: a total weight of 1" in \
        found[0].evidence, found


@pytest.mark.parametrize("loss", ["hand", "weighted"])
@pytest.mark.parametrize(("how", "batches", "k", "errors"),
                         [("k", 24, 5, {"F7"}), ("own", 24, 5, set()),
                          ("rescale", 24, 5, set()), ("k", 24, 4, set())],
                         ids=["tail_divided_by_k", "tail_own_length", "tail_rescaled_at_step",
                              "k_divides_the_epoch"])
def test_an_epoch_tail_of_a_loss_built_by_hand(tmp_path: Path, how: str, batches: int,
                                               k: int, errors: set[str], loss: str) -> None:
    """24 micro-batches per epoch, K = 5: each epoch's last window has 4, divided by 5 (F7
    from the loss built by hand); normalised by its own 4, divided by 5 and rescaled by 5/4
    at the step, or K = 4 dividing the epoch (no flush ever needed): silent. 'weighted': a
    mean of per-sample losses times per-sample weights read from the data (a weighting the
    user chose, not judged): the same mean's scale is read."""
    _epoch_run(tmp_path, k=k, batches=batches, how=how, loss=loss)
    found, resolved = _judge(tmp_path, k)
    assert resolved == k and {f.cls for f in found if f.severity == "error"} == errors, found
    assert not [f for f in found if f.severity == "warning"], found
    if errors:
        f = next(f for f in found if f.cls == "F7")
        assert "4 of K = 5" in f.evidence and "0.8 = 4/5" in f.evidence, f.evidence
    else:
        assert not found, found


def test_watching_the_short_epochs_changes_nothing(tmp_path: Path) -> None:
    """The run under the recording is bit-identical to the same run without it."""
    watched = _epoch_run(tmp_path, k=8, batches=6, how="k", loss="hand")
    torch.manual_seed(0)
    plain = _plain_run()
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))


def _plain_run() -> list[torch.Tensor]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(24, 8, generator=g),
                                          torch.randn(24, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        for i, (x, y) in enumerate(loader):
            (((model(x) - y) ** 2).mean() / 8).backward()
            if (i + 1) % 8 == 0 or i + 1 == len(loader):
                opt.step()
                opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_a_script_k_is_kept_only_when_every_epoch_is_shorter() -> None:
    """K = 8 from the script, windows of 6: kept when each window is a whole epoch (the run
    cannot reach K); windows of 6 inside longer passes disagree with it (inferred 6)."""
    rec = RunRecording(steps={0: [{"step": i, "backwards": 6, "data_pass_starts": [0]}
                                  for i in range(3)]})
    assert resolve_k(rec, None, _ScriptK(8)).k == 8
    inside = RunRecording(steps={0: [{"step": i, "backwards": 6,
                                      "data_pass_starts": [0] if i == 0 else []}
                                     for i in range(3)]})
    assert resolve_k(inside, None, _ScriptK(8)).strength == "inferred"
