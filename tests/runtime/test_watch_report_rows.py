"""The report's per-step rows say what was measured: a window clipped by value after its last
backward (correct) has a conservation distance that is the clip's doing, not an error; the
row says so instead of showing it as a number next to "no accumulation finding"."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.watch import recording
from accumguard.watch._report import judge

K = 3


def test_a_value_clip_after_the_last_backward_is_marked_clipped(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with recording(tmp_path):
        for _ in range(4):
            for _ in range(K):
                x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
                (F.cross_entropy(model(x), y) * 10 / K).backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)
            opt.step()
            opt.zero_grad()
    res = judge(tmp_path, accumulation_steps=K)
    assert not [f for f in res.findings if f.severity != "note"], res.findings
    first = res.report["steps"][0]
    assert first["conservation_error"] is None, first
    assert first["conservation_not_judged"].startswith("clipped after"), first


def test_ranks_that_never_step_are_said_not_judged() -> None:
    """A parameter server (round 103 c_b03): rank 1 runs its backwards and sends its gradient
    to rank 0 with ``dist.reduce``; only rank 0 steps. Rank 1's windows are not judged, and
    the report says so instead of a plain "no accumulation finding"."""
    from accumguard.cli.watch import _no_finding_line

    res = judge(Path(__file__).parents[1] / "observe" / "recorded"
                / "r103_parameter_server_reduce_to_rank0")
    assert res.report["ranks_without_steps"] == [1]
    assert any(p.startswith("rank(s) 1 ran 50 backward pass(es) and no optimizer step")
               for p in res.report["problems"]), res.report["problems"]
    assert "rank(s) 1 made no optimizer step" in _no_finding_line(res.report)
