"""A loss of several token-level terms where one term is a per-micro-batch masked mean
divided by K while the term beside it is normalised once over the window's token count
(PPO's value loss beside its policy loss; blind round 35 c_b02): summed over the window,
that term's tokens weigh 1/(K x their micro-batch's count), a mean of micro-batch means,
not the large batch's mean. An F5 error when the counts differ; equal counts, or the term
normalised like the other, say nothing at error level."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, ROWS, T, V = 4, 3, 4, 6, 5


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


def _loop(value_term: str, equal_counts: bool = False) -> Callable[[], None]:
    def loop() -> None:
        torch.manual_seed(0)
        body = torch.nn.Linear(3, V + 1)
        opt = torch.optim.SGD(body.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        for _ in range(STEPS):
            mbs = []
            for m in range(K):
                obs = torch.randn(ROWS, T, 3, generator=g)
                act = torch.randint(0, V, (ROWS, T), generator=g)
                ret = torch.randn(ROWS, T, generator=g)
                mask = torch.zeros(ROWS, T)
                for i in range(ROWS):  # right-padded rows; lengths differ per micro-batch
                    mask[i, : (T if equal_counts else 2 + (i + m) % (T - 1))] = 1
                mbs.append((obs, act, ret, mask))
            n_window = sum(mb[3].sum() for mb in mbs)
            for obs, act, ret, mask in mbs:
                out = body(obs)
                logp = torch.log_softmax(out[..., :V], -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)
                vf = (out[..., V] - ret) ** 2
                pg_loss = (-logp * mask).sum() / n_window
                if value_term == "per micro-batch / K":
                    vf_loss = (vf * mask).sum() / mask.sum() / K
                else:
                    vf_loss = (vf * mask).sum() / n_window
                (pg_loss + 0.5 * vf_loss).backward()
            opt.step()
            opt.zero_grad()
    return loop


def _findings(tmp_path: Path, loop: Callable[[], None]) -> list[Finding]:
    with recording(tmp_path):
        loop()
    return analyze(load_recordings(tmp_path))[0]


def test_a_per_micro_batch_mean_term_beside_a_window_mean_is_f5(tmp_path: Path) -> None:
    found = _findings(tmp_path, _loop("per micro-batch / K"))
    errors = [f for f in found if f.severity == "error"]
    assert [f.cls for f in errors] == ["F5"], found
    assert "mean of per-micro-batch means" in errors[0].title
    assert "divided by K = 4" in errors[0].evidence


@pytest.mark.parametrize(("term", "equal"), [("window count", False),
                                             ("per micro-batch / K", True)])
def test_the_same_term_over_the_window_or_equal_counts_is_silent(
        tmp_path: Path, term: str, equal: bool) -> None:
    found = _findings(tmp_path, _loop(term, equal_counts=equal))
    assert [f for f in found if f.severity == "error"] == [], found
