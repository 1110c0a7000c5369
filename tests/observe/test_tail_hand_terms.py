"""A short last window divided by K in a loss built by hand as a sum of mean terms (blind
round 66 c_b03: a REINFORCE term from log_softmax + gather weighted by advantages, plus
a KL term, ``(pg + c * kl).mean() / K``; no loss call records its weights). The constants
above the sum are read from the graph: full windows weigh 1, the tail of 2 micro-steps
divided by K weighs 2/K (F7); the same tail divided by its own size weighs 1 (silent)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, BATCHES, ROWS, T, V = 4, 10, 3, 5, 7  # windows of 4, 4 and a tail of 2


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


def _loss(policy: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, act: torch.Tensor,
          adv: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(policy(x), -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ref_logp = torch.log_softmax(ref(x), -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)
    seq_logp, kl = logp.sum(1) / T, (logp - ref_logp).sum(1) / T
    return (-adv * seq_logp + 0.05 * kl).mean()


def _errors(tmp_path: Path, tail_by_own_size: bool) -> list[Finding]:
    torch.manual_seed(0)
    policy, ref = torch.nn.Linear(4, V), torch.nn.Linear(4, V)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(ROWS, T, 4, generator=g), torch.randint(0, V, (ROWS, T), generator=g),
             torch.randn(ROWS, generator=g)) for _ in range(BATCHES)]
    with recording(tmp_path):
        for i, (x, act, adv) in enumerate(data):
            size = min(K, BATCHES - i // K * K) if tail_by_own_size else K
            (_loss(policy, ref, x, act, adv) * (1.0 / size)).backward()
            if (i + 1) % K == 0 or i + 1 == BATCHES:
                opt.step()
                opt.zero_grad(set_to_none=True)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in findings if f.severity == "error"]


def test_a_tail_of_hand_built_mean_terms_divided_by_k_is_f7(tmp_path: Path) -> None:
    found = _errors(tmp_path, tail_by_own_size=False)
    assert [f.cls for f in found] == ["F7"], found
    assert "2 of K = 4 micro-steps" in found[0].evidence, found[0].evidence
    assert "multiplied by 1/4" in found[0].evidence and "0.5 = 2/4" in found[0].evidence


def test_the_same_tail_divided_by_its_own_size_is_silent(tmp_path: Path) -> None:
    assert _errors(tmp_path, tail_by_own_size=True) == []
