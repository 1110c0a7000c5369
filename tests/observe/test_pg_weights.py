"""Per-token weights of a policy-gradient loss built by hand (``log_softmax`` + ``gather``,
or TRL's ``selective_log_softmax``) multiplied by advantages and a mask: the weight each
token carries is read as the gradient reaching the selection divided by the data factors
(:func:`accumguard.observe._losses_terms.factor_stats`), so F5 (a masked token mean per
micro-batch, then / K, over uneven completion lengths: the GRPO "length bias" normaliser)
is an error, and the correct normalisations stay silent. Every loop runs in this process
under ``recording`` (what ``watch`` installs) and is analysed as ``watch`` does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, B = 4, 3, 4
V, T = 13, 9


@pytest.fixture(autouse=True)
def _every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record every window (the loss record samples a toy's windows by timing)."""
    import accumguard.observe._losses as losses

    monkeypatch.setattr(losses, "_ALWAYS", 1000)


class _Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, 8)
        self.head = torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x)))


def _rollout(g: torch.Generator, m: int, *, equal: bool, zero_adv: bool, one_len: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``B`` completions: tokens, a float 0/1 mask of uneven lengths (or the same total
    per micro-batch with ``equal``; one length for every row of a micro-batch with
    ``one_len``), group-normalised advantages (a zero group)."""
    seq = torch.randint(1, V, (B, T + 1), generator=g)
    if one_len:
        lens = torch.full((B,), 2 + 2 * (m % 4))
    elif equal:  # every micro-batch holds 16 completion tokens, spread unevenly over rows
        lens = torch.tensor([2, 6, 5, 3]).roll(m)
    else:
        lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lens[:, None]).float()
    r = torch.randn(B, generator=g)
    adv = (r - r.mean()) / (r.std() + 1e-4)
    if zero_adv:
        adv[:2] = 0.0  # a group whose rewards were all equal
    return seq, mask, adv


def _logp(policy: _Policy, seq: torch.Tensor, how: str) -> torch.Tensor:
    logits = policy(seq[:, :-1])
    if how == "trl":
        from trl.trainer.utils import selective_log_softmax

        return selective_log_softmax(logits, seq[:, 1:])
    return torch.log_softmax(logits, -1).gather(-1, seq[:, 1:].unsqueeze(-1)).squeeze(-1)


def _loop(norm: str, *, how: str = "gather", equal: bool = False, zero_adv: bool = False,
          one_len: bool = False) -> Callable[[], None]:
    def loop() -> None:
        torch.manual_seed(0)
        policy = _Policy()
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(4)
        for _ in range(STEPS):
            batches = [_rollout(g, m, equal=equal, zero_adv=zero_adv, one_len=one_len)
                       for m in range(K)]
            window = sum(float(mk.sum()) for _, mk, _ in batches)
            for seq, mask, adv in batches:
                per_token = -adv[:, None] * _logp(policy, seq, how)
                if norm == "micro":  # the bug: this micro-batch's tokens, then / K
                    loss = (per_token * mask).sum() / mask.sum() / K
                elif norm == "window":  # the window's completion tokens
                    loss = (per_token * mask).sum() / window
                elif norm == "drgrpo":  # Dr. GRPO: a constant (rows x max length)
                    loss = (per_token * mask).sum() / (B * T) / K
                else:  # "sequence": each completion's token mean, mean over completions
                    loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean() / K
                loss.backward()
            opt.step()
            opt.zero_grad()

    return loop


def _run(tmp_path: Path, loop: Callable[[], None]) -> tuple[list[Finding], list[dict]]:
    with recording(tmp_path):
        loop()
    rec = load_recordings(tmp_path)
    findings, _, _ = analyze(rec)
    return findings, rec.steps[0]


def _errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


@pytest.mark.parametrize(("how", "zero_adv"), [("gather", False), ("gather", True),
                                               ("trl", False)])
def test_pg_token_mean_per_micro_batch_is_f5(tmp_path: Path, how: str, zero_adv: bool
                                             ) -> None:
    findings, steps = _run(tmp_path, _loop("micro", how=how, zero_adv=zero_adv))
    (f,) = _errors(findings)
    assert f.cls == "F5", findings
    assert "reduction='log-prob'" in f.evidence and "divided by K" in f.evidence, f.evidence
    recs = [r for s in steps for r in s.get("losses") or []]
    # each record counts the mask's tokens, zero advantages included
    assert recs and all(r[6] == "log-prob" for r in recs)
    assert all(abs(float(r[4]) * float(r[3]) * K - 1.0) < 1e-5 for r in recs), recs


@pytest.mark.parametrize(("norm", "how", "equal", "zero_adv", "one_len"), [
    ("window", "gather", False, False, False),
    ("window", "gather", False, True, False),
    ("window", "trl", False, False, False),
    ("drgrpo", "gather", False, False, False),
    ("sequence", "gather", False, False, False),
    ("micro", "gather", True, False, False),  # equal counts: the micro mean is the window's
    # completions of one length per micro-batch (4 in one, 8 in the next): the token mean
    # per micro-batch is then also each completion's mean, averaged (GRPO's sequence
    # unit): every token of a micro-batch gets one weight varying with the length, and
    # nothing proves the unit is tokens: silent
    ("micro", "gather", False, False, True),
    ("sequence", "gather", False, False, True),
])
def test_pg_correct_normalisers_are_silent(tmp_path: Path, norm: str, how: str, equal: bool,
                                           zero_adv: bool, one_len: bool) -> None:
    findings, steps = _run(tmp_path, _loop(norm, how=how, equal=equal, zero_adv=zero_adv,
                                           one_len=one_len))
    assert _errors(findings) == [], findings
    assert any(r[0] == "select" for s in steps for r in s.get("terms") or [])  # recorded
    if norm in ("window", "drgrpo") or equal:  # the weights were read: one per window
        recs = [r for s in steps for r in s.get("losses") or []]
        assert recs, steps


def _seq_loop(norm: str) -> Callable[[], None]:
    """GRPO with dynamic sampling: micro-batches of 2, 6, 3 and 5 completions (filtered
    groups); one value per completion (its token mean times the advantage), then ``mean``:
    a mean over the micro-batch's completions / K (the bug), or ``window``: their sum over
    the window's count of completions."""
    sizes = [2, 6, 3, 5]

    def loop() -> None:
        torch.manual_seed(0)
        policy = _Policy()
        opt = torch.optim.SGD(policy.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(5)
        for _ in range(STEPS):
            for m in range(K):
                n = sizes[m] if norm != "equal" else 4
                seq = torch.randint(1, V, (n, T + 1), generator=g)
                lens = torch.randint(1, T + 1, (n,), generator=g)
                mask = (torch.arange(T)[None, :] < lens[:, None]).float()
                adv = torch.randn(n, generator=g)
                per_seq = (-adv[:, None] * _logp(policy, seq, "gather") * mask).sum(-1) \
                    / mask.sum(-1)
                if norm == "window":
                    loss = per_seq.sum() / sum(sizes)
                else:  # "mean" (uneven sizes: the bug) and "equal" (4 each: right)
                    loss = per_seq.mean() / K
                loss.backward()
            opt.step()
            opt.zero_grad()

    return loop


@pytest.mark.parametrize(("norm", "expected"), [("mean", ["F5"]), ("window", []),
                                                ("equal", [])])
def test_pg_sequence_mean_per_micro_batch_over_uneven_counts(tmp_path: Path, norm: str,
                                                             expected: list[str]) -> None:
    """A per-completion value averaged over each micro-batch's completions, / K, while the
    micro-batches hold different numbers of completions: each micro-batch weighs the same,
    a completion 1/(K n_m) instead of 1/N (F5 one level up from tokens). The window's count
    of completions as the divisor, or equal counts, are the large batch's mean: silent."""
    findings, _ = _run(tmp_path, _seq_loop(norm))
    errors = _errors(findings)
    assert [f.cls for f in errors] == expected, findings
    if expected:
        assert "uneven sequence counts" in errors[0].title
        assert "2 / 6 / 3 / 5 sequences" in errors[0].evidence, errors[0].evidence
