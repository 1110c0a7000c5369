"""A per-token log-prob term normalised by its window's token count and divided by K as well
(blind round 81 c_b01: ``(dpo + alpha * nll_sum / n_window) / K``): it weighs 1/K of its
coefficient, a LOSS_SCALE error; the same term left out of the /K (``dpo / K + alpha * nll_sum /
n_window``), or multiplied by K before the whole loss's /K, is right and silent. One process,
the run unchanged by the observation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, V, STEPS = 4, 11, 3


def _train(twice: bool | None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(V, 16), torch.nn.Linear(16, V))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        window = []
        for _ in range(K):
            ids = torch.randint(0, V, (3, 8), generator=g)
            mask = torch.zeros(3, 7)
            for row in range(3):  # a completion of uneven length after a prompt
                mask[row, int(torch.randint(1, 4, (1,), generator=g)):] = 1.0
            window.append((ids, mask))
        n_tok = sum(float(m.sum()) for _, m in window)
        for ids, mask in window:
            lp = torch.log_softmax(model(ids[:, :-1]), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            seq = (lp * mask).sum(-1)
            pref = -F.logsigmoid(seq[0] - seq[1:]).mean()  # a preference term, per micro-batch
            nll = -(lp * mask).sum() / n_tok
            if twice is None:  # the window's count times K, then the whole loss over K
                loss = (pref + 0.5 * (nll * K)) / K
            else:
                loss = (pref + 0.5 * nll) / K if twice else pref / K + 0.5 * nll
            loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("twice", "errors"), [(True, {"LOSS_SCALE"}), (False, set()),
                                             (None, set())],
                         ids=["window_count_then_k", "window_count_only", "times_k_then_k"])
def test_a_window_normalised_selection_divided_by_k_again(tmp_path: Path, twice: bool | None,
                                                         errors: set[str]) -> None:
    plain = _train(twice)
    with recording(tmp_path):
        seen = _train(twice)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    found, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    got = {f.cls for f in found if f.severity == "error"}
    assert got == errors, found
    if errors:
        f = next(f for f in found if f.cls == "LOSS_SCALE")
        assert f"1/{K} of its coefficient" in f.title, f
