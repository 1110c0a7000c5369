"""A clip whose parameters hold no gradient yet is no clipping event (blind round 104 b_c02,
a false F8 before): under FSDP2 with the window's sync deferred the sharded parameters'
``.grad`` stays None until the window's last backward, so ``clip_grad_norm_`` after every
backward reads nothing and changes nothing mid-window and clips the whole window at its end.
The same holds in one process for gradients moved aside after each backward (an fp32 stash
put back before the step). A clip that finds gradients mid-window stays F8."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording
from tests.helpers import judge_recorded

K, STEPS = 4, 3


def _loop(stash: bool) -> list[torch.Tensor]:
    """Clip after every backward; ``stash``: each backward's gradient is moved aside first
    (``.grad`` None when the clip runs mid-window) and the window's sum put back at its end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    g = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        buf = [torch.zeros_like(p) for p in params]
        for m in range(K):
            x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
            (F.cross_entropy(model(x), y) / K).backward()
            if stash:
                for b, p in zip(buf, params, strict=True):
                    assert p.grad is not None
                    b.add_(p.grad)
                    p.grad = None
                if m == K - 1:
                    for b, p in zip(buf, params, strict=True):
                        p.grad = b
            torch.nn.utils.clip_grad_norm_(params, 0.05)
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in params]


def _errors(tmp_path: Path, stash: bool) -> list[Finding]:
    plain = _loop(stash)
    with recording(tmp_path):
        seen = _loop(stash)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_a_clip_of_parameters_without_gradients_is_no_clip(tmp_path: Path) -> None:
    assert [f for f in _errors(tmp_path, stash=True) if f.cls == "F8"] == []


def test_a_clip_that_finds_gradients_mid_window_is_f8(tmp_path: Path) -> None:
    assert [f.cls for f in _errors(tmp_path, stash=False)] == ["F8"]


def test_fsdp2_clip_while_the_sync_is_deferred_is_silent() -> None:
    """Recorded on 2 gloo ranks: FSDP2 nested units, windows of 4-4-2 with the sync deferred
    to each window's last backward, clip_grad_norm_ after every backward."""
    assert [f for f in judge_recorded("r104_fsdp2_clip_while_sync_deferred")
            if f.severity == "error"] == []
