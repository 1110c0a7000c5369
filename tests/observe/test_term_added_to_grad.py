"""A term added to ``.grad`` after every backward (Lightning's ``on_after_backward``, a hook:
blind round 131 c_b01's L2-SP penalty) makes the window's gradient grow between backward
passes by something other than a backward. Whether that is wrong depends on the term's size,
which the run does not know: added in full on each of K micro-steps it counts K times
(LOSS_SCALE), divided by K it is added once in all (correct). The run says so as a warning,
never the F3 error ("the gradient was changed ... the optimizer did not receive the sum")
it said before, which was false on the /K form. A clear inside the window stays F3."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS = 4, 3


def _loop(mode: str) -> list[torch.Tensor]:
    """After each backward: ``full`` adds the penalty's gradient, ``over_k`` adds it / K,
    ``clear`` zeroes the first layer's gradient."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    anchor = [p.detach().clone() + 0.5 for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        for _ in range(K):
            x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
            (F.cross_entropy(model(x), y) / K).backward()
            with torch.no_grad():
                for p, p0 in zip(model.parameters(), anchor, strict=True):
                    assert p.grad is not None
                    if mode == "clear" and p.dim() == 2 and p.shape[1] == 5:
                        p.grad.zero_()
                    elif mode != "clear":
                        p.grad.add_(p - p0, alpha=0.2 / (K if mode == "over_k" else 1))
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _findings(tmp_path: Path, mode: str) -> list[Finding]:
    plain = _loop(mode)
    with recording(tmp_path):
        seen = _loop(mode)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return findings


def test_a_term_added_after_every_backward_is_a_loss_scale_warning(tmp_path: Path) -> None:
    found = _findings(tmp_path, "full")
    assert not [f for f in found if f.severity == "error"], found
    (w,) = [f for f in found if f.cls == "LOSS_SCALE"]
    assert w.severity == "warning" and "grew before backward pass(es) 2, 3, 4 of 4" in w.evidence
    assert "on_before_optimizer_step" in w.fix


def test_the_same_term_divided_by_k_is_no_error(tmp_path: Path) -> None:
    found = _findings(tmp_path, "over_k")
    assert not [f for f in found if f.severity == "error"], found


def test_a_clear_inside_the_window_stays_f3(tmp_path: Path) -> None:
    found = _findings(tmp_path, "clear")
    assert [f.cls for f in found if f.severity == "error"][:1] == ["F3"], found
