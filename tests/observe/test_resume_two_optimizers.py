"""A trainer with two optimizers over disjoint parameters (a backbone's and a head's), its
run pre-empted mid-window and rebuilt in the same process (a new model, new optimizers),
resuming from the saved micro-batch with the saved partial gradient restored into
``.grad``; the data ends in a short window (blind round 58 c_c03's shape). Each new
optimizer's windows are judged on their own: its first window (the rest of the saved one)
and the run's last (short) window are right, not an off-by-one counter (F13). Recorded in
process as ``watch`` records it, judged by the CLI's function."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accumguard.watch import recording
from accumguard.watch._report import judge

K = 3
BATCH = 4
N = 44  # 11 micro-batches: windows 3, 3, 3, 2
STOP = 7  # pre-empted after 7 micro-batches (window 3 holds 1 of 3)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))


def _run(out: Path, restore: bool, stop: int = STOP, epochs: int = 1) -> None:
    """The first trainer stops after ``stop`` micro-batches; the rebuilt one runs the rest of
    the pass, then ``epochs - 1`` whole passes."""
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(N, 8, generator=g),
                                          torch.randn(N, 2, generator=g))
    saved: dict[str, object] = {}

    def train(start: int, stop: int | None, epochs: int) -> None:
        torch.manual_seed(0)
        net = _Net()
        if "model" in saved:
            net.load_state_dict(saved["model"])  # type: ignore[arg-type]
        opts = [torch.optim.SGD(net.body.parameters(), lr=0.1, momentum=0.9),
                torch.optim.Adam(net.head.parameters(), lr=1e-2)]
        if restore and "grads" in saved:
            for name, p in net.named_parameters():
                p.grad = saved["grads"][name].clone()  # type: ignore[index]
        for epoch in range(epochs):
            first = start if epoch == 0 else 0
            loader = torch.utils.data.DataLoader(
                torch.utils.data.Subset(data, range(first * BATCH, N)), batch_size=BATCH)
            micro = first
            for x, y in loader:
                end = min((micro // K + 1) * K * BATCH, N)
                size = end - (micro // K) * K * BATCH  # this window's samples
                (F.mse_loss(net(x), y, reduction="sum") / size).backward()
                micro += 1
                if micro * BATCH == end:
                    for o in opts:
                        o.step()
                    for o in opts:
                        o.zero_grad(set_to_none=True)
                if stop is not None and micro == stop:
                    saved["model"] = {k: v.clone() for k, v in net.state_dict().items()}
                    saved["grads"] = {n: p.grad.clone() if p.grad is not None else
                                      torch.zeros_like(p) for n, p in net.named_parameters()}
                    return

    with recording(out) as obs:
        obs.budget = None
        train(0, stop, 1)
        train(stop, None, epochs)


@pytest.mark.parametrize("restore", [True, False], ids=["restored", "not_restored"])
def test_a_resumed_trainer_with_two_optimizers_is_not_called_off_by_one(
        tmp_path: Path, restore: bool) -> None:
    """Restored: the large batch, no error. Not restored: the resumed window lacks the saved
    micro-batch, but the run never shows a whole window after the resume (the data ends in
    a short one), so nothing proves the counter off: no error either (the first case is
    what the run shows; an error would claim more than was measured)."""
    _run(tmp_path / "r", restore)
    res = judge(tmp_path / "r", accumulation_steps=K)
    assert not res.errors, [(f.cls, f.evidence) for f in res.errors]


def test_a_resume_onto_the_epochs_short_tail_with_two_optimizers_is_silent(tmp_path: Path) -> None:
    """Pre-empted at the boundary before the pass's short tail (9 of 11 micro-batches) and
    rebuilt: each new optimizer's first window is the tail (normalised by its own samples),
    then a whole pass. The DataLoader pass that starts after the tail ends it, though only
    the first optimizer's step record holds that pass start (both step on one window; blind
    round 62 c_c02's shape)."""
    _run(tmp_path / "r", restore=False, stop=9, epochs=2)
    res = judge(tmp_path / "r", accumulation_steps=K)
    assert not res.errors, [(f.cls, f.evidence) for f in res.errors]
