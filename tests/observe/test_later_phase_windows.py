"""A script that trains with K, then runs a large-batch reference with another optimizer
object in the same process (blind round 31, writer c: an HF Trainer with K = 3 on 2 ranks,
then rank 0's reference accumulating the K x W = 6 micro-batches of each window): the
reference's windows of 6 are a phase of their own, not an off-by-one counter (F13) of the
training's K = 3 (blind round 33, writer a: an HF Trainer whose single-process reference
stepped once per whole batch *before* the training: F1 before), and the DDP sync flags of a window in which the watched model ran no forward
(the reference model's window) say nothing about synchronisation."""

from __future__ import annotations

from pathlib import Path

import torch

from accumguard.core.window import StepRecord
from accumguard.observe._step_rules import _sync_findings
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS = 3, 4


def _run(ref_windows: list[int]) -> None:
    """K = 3 windows with one optimizer, then a reference phase with another optimizer
    whose windows have the given sizes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        for _ in range(K):
            (model(torch.randn(5, 4)).pow(2).mean() / K).backward()
        opt.step()
        opt.zero_grad()
    ref = torch.nn.Linear(4, 1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for n in ref_windows:
        for _ in range(n):
            (ref(torch.randn(5, 4)).pow(2).mean() / n).backward()
        ref_opt.step()
        ref_opt.zero_grad()


def test_a_reference_phase_accumulating_k_times_w_is_judged_on_its_own(tmp_path: Path) -> None:
    with recording(tmp_path):
        _run([2 * K] * STEPS)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)  # K declared (--k)
    assert not [f for f in findings if f.severity.value != "note"], findings
    (note,) = [f for f in findings if "later phase" in f.title]
    assert f"judged on its own (K = {2 * K}), not as windows of K = {K}" in note.title
    assert f"each after {2 * K} backward passes" in note.evidence
    # the training's last step as the table numbers it (from 1), and the phase's first
    assert f"after optimizer step {STEPS}, where the optimizer" in note.evidence
    assert note.step == STEPS + 1  # the reference phase's first step


def test_the_same_windows_with_one_optimizer_stay_f13(tmp_path: Path) -> None:
    """Control: one optimizer object whose windows go from K to 2K is not a new phase."""
    with recording(tmp_path):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(2 * STEPS):
            for _ in range(K if i < STEPS else 2 * K):
                (model(torch.randn(5, 4)).pow(2).mean() / K).backward()
            opt.step()
            opt.zero_grad()
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    assert any(f.cls == "F13" and f.severity.value == "error" for f in findings), findings


def test_sync_flags_of_a_window_without_a_forward_of_the_watched_model_say_nothing() -> None:
    reference = StepRecord(step=4, backwards=3, engine="ddp", sync_micros=[True, True, True],
                           sync_backward=[True, True, True], forwards=[0, 0, 0])
    assert _sync_findings(0, reference) == []
    training = StepRecord(step=4, backwards=3, engine="ddp", sync_micros=[True, True, True],
                          sync_backward=[True, True, True], forwards=[1, 1, 1])
    (f,) = _sync_findings(0, training)
    assert f.cls == "EXTRA_SYNC"


def test_a_reference_phase_with_short_tails_is_still_its_own_phase(tmp_path: Path) -> None:
    """The reference's own passes end in shorter windows (4 windows of 6, then one of 2)."""
    with recording(tmp_path):
        _run([2 * K] * STEPS + [2])
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    assert not [f for f in findings if f.severity.value == "error"], findings
    (note,) = [f for f in findings if "later phase" in f.title]
    assert f"{STEPS} of them after {2 * K} backward passes, the others after fewer" in note.evidence


def _reference_first(ref_steps: int, *, new_optimizer: bool) -> None:
    """A large-batch reference stepping once per whole batch first, then the training's K
    windows (with another optimizer object, or, as the control, the same one)."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(ref_steps):
        ref(torch.randn(4 * K, 4)).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
    model = ref if not new_optimizer else torch.nn.Linear(4, 1)
    opt = ref_opt if not new_optimizer else torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        for _ in range(K):
            (model(torch.randn(4, 4)).pow(2).mean() / K).backward()
        opt.step()
        opt.zero_grad()


def test_a_reference_phase_before_the_training_is_judged_on_its_own(tmp_path: Path) -> None:
    with recording(tmp_path):
        _reference_first(3, new_optimizer=True)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    assert not [f for f in findings if f.severity.value != "note"], findings
    (note,) = [f for f in findings if "earlier phase" in f.title]
    assert "judged on its own (K = 1), not F1" in note.title
    assert "made the run's first 3 step(s), each after a single backward pass" in note.evidence


def test_the_same_optimizer_stepping_every_backward_first_stays_f1(tmp_path: Path) -> None:
    """Control: one optimizer object that steps after every backward, then accumulates K."""
    with recording(tmp_path):
        _reference_first(3, new_optimizer=False)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    assert any(f.cls == "F1" and f.severity.value == "error" for f in findings), findings


def test_a_reference_after_windows_of_k_times_k_is_its_own_phase_not_f1(tmp_path: Path) -> None:
    """Blind round 47, b_b02: a DeepSpeed engine with GA = K gated K backwards by hand, so its
    one optimizer object stepped after K x K backwards (F14, judged elsewhere); rank 0's
    reference with another optimizer then stepped after every backward. That reference is a
    phase of its own (a note), not F1 of the training."""
    with recording(tmp_path):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(K * K):
            (model(torch.randn(5, 4)).pow(2).mean() / K).backward()
        opt.step()
        opt.zero_grad()
        ref = torch.nn.Linear(4, 1)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for _ in range(STEPS):
            ref(torch.randn(5 * K, 4)).pow(2).mean().backward()
            ref_opt.step()
            ref_opt.zero_grad()
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    assert not [f for f in findings if f.cls == "F1" and f.severity.value != "note"], findings
    (note,) = [f for f in findings if "later phase" in f.title]
    assert "judged on its own (K = 1), not F1" in note.title
