"""Epochs under the real ``accumguard watch`` launch: Lightning 2.6 with
``accumulate_grad_batches=4`` on epochs of 3 batches (it steps at each epoch's end and
divides every batch's loss by 4: F7, each update 3/4 of its window's mean) and its twin with
K = 3; a plain loop whose next-epoch zero_grad drops each epoch's tail (a warning, not an
error) and its twin stepping on the tail normalised by its own size.

The four cases run in one ``python`` launch (tests/watch_sweep.py), each recorded as
``watch`` records it and judged by the function the CLI calls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_watch import _errors
from watch_sweep import Watched, watch_many

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "short_epochs.py"


CASES = [
    ("lightning_short", {"F7"}), ("lightning_ok", set()),
    ("plain_drop", set()), ("plain_tail_ok", set())]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    pytest.importorskip("pytorch_lightning")
    return watch_many(tmp_path_factory.mktemp("epochs"),
                      {mode: [sys.executable, str(SCRIPT), mode] for mode, _ in CASES})


@pytest.mark.parametrize(("mode", "expected"), CASES)
def test_epochs(watched: dict[str, Watched], mode: str, expected: set[str]) -> None:
    code, findings, report, proc = watched[mode]
    assert "done" in proc.stdout, proc.stderr[-2000:]
    assert _errors(findings) == expected, findings
    if mode == "lightning_short":
        f7 = next(f for f in findings if f["cls"] == "F7")
        assert "0.75 = 3/4" in f7["evidence"] and "declared by lightning" in f7["evidence"]
        assert not [f for f in findings if f["cls"] == "F13"], findings
        assert [e["micro_batches"] for e in report["epochs"]] == [3, 3, 3]
        assert [e["optimizer_steps"] for e in report["epochs"]] == [1, 1, 1]
    if mode == "plain_drop":
        assert [(f["cls"], f["severity"]) for f in findings
                if f["severity"] != "note"] == [("F7", "warning")], findings


def test_two_optimizers_epochs_count_each_micro_batch_once(tmp_path: Path) -> None:
    """Two optimizers over disjoint parameters stepping together every K = 2 micro-batches,
    two passes of 12 batches: each optimizer's step records hold the same window's
    backwards, and the report's epochs summed them per record (24 micro-batches, 12 steps
    per pass). Counted on the first optimizer's windows: 12 and 6, named so; the steps
    table says which optimizer each row is."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own alias
    from torch.utils.data import DataLoader, TensorDataset

    from accumguard.watch import recording
    from accumguard.watch._report import judge

    torch.manual_seed(0)
    body, head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)
    opts = [torch.optim.AdamW(body.parameters(), lr=1e-3), torch.optim.SGD(head.parameters(),
                                                                           lr=0.1)]
    loader = DataLoader(TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,))),
                        batch_size=4)
    with recording(tmp_path):
        for _ in range(2):
            for i, (x, y) in enumerate(loader):
                (F.cross_entropy(head(torch.tanh(body(x))), y) / 2).backward()
                if (i + 1) % 2 == 0:
                    for opt in opts:
                        opt.step()
                        opt.zero_grad()
    res = judge(tmp_path)
    assert not res.errors, res.findings
    epochs = res.report["epochs"]
    assert [(e["micro_batches"], e["optimizer_steps"]) for e in epochs] == [(12, 6), (12, 6)]
    assert all(e["optimizer_steps_of"] == "optimizer #1 (AdamW)" for e in epochs), epochs
    assert [(r["optimizer"], r["optimizer_index"]) for r in res.report["steps"][:4]] == [
        ("AdamW", None), ("SGD", 2), ("AdamW", 1), ("SGD", 2)], res.report["steps"][:4]
