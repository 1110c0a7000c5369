"""A loss normalised per sample (each sequence's token sum divided by its own length, then
the mean over the micro-batch's sequences, / K) is the mean over the window's samples when
every micro-batch holds as many sequences: not F5, whatever the token counts. Blind round
107 a_b01_fixed had a false F5 error: with the sequences of one micro-batch of equal
length, every token of a micro-batch carried one weight and the micro-batches' token
counts differed, which read as a per-micro-batch token mean. A loss whose rows are divided
by their own counts is now not read as a token mean; a real per-micro-batch token mean
still is F5."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, V = 4, 3, 11


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Two sequences per micro-batch, both of one length, the length differing between
    micro-batches (padding -100 after it)."""
    g = torch.Generator().manual_seed(6)
    out = []
    for _ in range(STEPS):
        window = []
        for m in range(K):
            length = 3 + 2 * m
            x = torch.randn(2, 9, 5, generator=g)
            y = torch.randint(0, V, (2, 9), generator=g)
            y[:, length:] = -100
            window.append((x, y))
        out.append(window)
    return out


def _loop(per_sample: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(5, V)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for window in _batches():
        for x, y in window:
            logits = model(x)
            if per_sample:
                tok = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-100,
                                      reduction="none").view_as(y)
                valid = (y != -100).float()
                loss = ((tok * valid).sum(1) / valid.sum(1)).mean()
            else:
                loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-100)
            (loss / K).backward()
        opt.step()
        opt.zero_grad()


def _errors(tmp_path: Path, per_sample: bool) -> list[Finding]:
    with recording(tmp_path):
        _loop(per_sample)
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in findings if f.severity == "error"]


def test_a_per_sample_mean_with_equal_rows_per_micro_batch_is_silent(tmp_path: Path) -> None:
    assert _errors(tmp_path, per_sample=True) == []


def test_a_per_micro_batch_token_mean_over_uneven_counts_is_still_f5(tmp_path: Path) -> None:
    assert [f.cls for f in _errors(tmp_path, per_sample=False)] == ["F5"]
