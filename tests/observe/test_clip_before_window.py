"""A clip that runs before its window's first backward (blind round 113 b_b03: an HF
callback clipping in ``on_step_begin``, the Trainer's own clip off): the previous step left
every ``.grad`` None, so the clip reads nothing and the window's gradient is stepped
unclipped. Before, such a call was no clipping event at all (silent); it is now F8. The
twin clipping in ``on_pre_optimizer_step`` is silent. Recorded runs (2 gloo ranks, the HF
Trainer) and an in-process loop whose weights are compared with an unobserved run."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording
from tests.helpers import judge_recorded

K = 3


def test_an_hf_callback_clipping_in_on_step_begin_is_f8() -> None:
    errors = [f for f in judge_recorded("r113_hf_clip_in_on_step_begin") if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F8"}, errors
    assert "clips nothing" in errors[0].title
    assert "on_pre_optimizer_step" in errors[0].fix


def test_an_hf_callback_clipping_in_on_pre_optimizer_step_is_silent() -> None:
    found = judge_recorded("r113_hf_clip_in_on_pre_optimizer_step")
    assert [f for f in found if f.severity != "note"] == [], found


def _train(clip_first: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        if clip_first:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        for _ in range(K):
            x, y = torch.randn(5, 6, generator=gen), torch.randint(0, 3, (5,), generator=gen)
            (F.cross_entropy(model(x), y) / K).backward()
        if not clip_first:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def test_a_clip_before_the_first_backward_is_f8_and_the_run_is_unchanged(tmp_path: Path) -> None:
    plain = _train(clip_first=True)
    with recording(tmp_path / "early"):
        watched = _train(clip_first=True)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)
    found, _, _ = analyze(load_recordings(tmp_path / "early"), k_flag=K)
    errors = [f for f in found if f.severity == "error"]
    assert [f.cls for f in errors] == ["F8"], found
    with recording(tmp_path / "late"):
        _train(clip_first=False)
    found, _, _ = analyze(load_recordings(tmp_path / "late"), k_flag=K)
    assert [f for f in found if f.severity != "note"] == [], found


def test_an_fsdp2_clip_before_the_synchronising_backward_is_f8() -> None:
    """Blind round 115 b_b02: FSDP2 with sync deferred, the clip placed on the window's last
    micro-step before its backward: the sharded ``.grad`` is still None (FSDP2 writes it at
    the synchronising backward), so the clip reads nothing. The twin clips after it."""
    errors = [f for f in judge_recorded("r115_fsdp2_clip_before_sync_backward")
              if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F8"}, errors
    assert "before the last" in errors[0].evidence and "FSDP2" in errors[0].evidence
    found = judge_recorded("r115_fsdp2_clip_after_sync_backward")
    assert [f for f in found if f.severity != "note"] == [], found
