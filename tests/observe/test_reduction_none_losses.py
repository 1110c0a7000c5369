"""``cross_entropy(..., reduction='none')`` reduced by the script itself is recorded: its
tokens' weight is the gradient reaching the per-token output when that gradient is one value
at every valid token (blind round 47, writer a: a Trainer-style loss `ce.sum() * W / N`
beside a PaLM z-loss `lse.pow(2)[mask].mean()` not divided by K was silent, since neither
term was a recorded loss call). Real runs, observed in this process, judged on the record."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

from helpers import recorded_failures

K, STEPS, V = 4, 3, 11


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(STEPS):
        window = []
        for m in range(K):
            x = torch.randn(3, 7, 8, generator=g)
            y = torch.randint(0, V, (3, 7), generator=g)
            y[:, 2 + m:] = -100  # uneven valid tokens per micro-batch
            window.append((x, y))
        out.append(window)
    return out


def _train(tmp_path: Path, loss_of: str) -> list:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, V)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(tmp_path):
        for window in _batches():
            n_window = sum(int((y != -100).sum()) for _, y in window)
            for x, y in window:
                logits = model(x)
                ce = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=-100, reduction="none")
                mask = y != -100
                lse = torch.logsumexp(logits, dim=-1)
                if loss_of == "zloss_undivided":
                    loss = ce.sum() / n_window + 0.1 * lse.pow(2)[mask].mean()
                elif loss_of == "zloss_window":
                    loss = ce.sum() / n_window + 0.1 * lse.pow(2)[mask].sum() / n_window
                elif loss_of == "micro_mean":
                    loss = ce[mask].mean() / K
                elif loss_of == "window_mean":
                    loss = ce.sum() / n_window
                elif loss_of == "masked_micro_mean":
                    # the CE sees every position (no ignore_index): the mask comes after it
                    ce_all = F.cross_entropy(logits.transpose(1, 2), y.clamp(min=0), reduction="none")
                    loss = (ce_all * mask).sum() / mask.sum()
                elif loss_of == "masked_window":
                    ce_all = F.cross_entropy(logits.transpose(1, 2), y.clamp(min=0), reduction="none")
                    loss = (ce_all * mask).sum() / n_window
                else:  # per-token weights: no single weight, not read
                    w = torch.linspace(0.5, 1.5, ce.numel()).reshape(ce.shape)
                    loss = (ce * w).sum() / n_window
                loss.backward()
            opt.step()
            opt.zero_grad()
    findings, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in findings if f.severity.value == "error"]


def test_an_undivided_mean_term_beside_a_none_loss_over_the_window_is_loss_scale(tmp_path: Path) -> None:
    errors = _train(tmp_path, "zloss_undivided")
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert "4x" in errors[0].title


def test_the_term_over_the_window_is_silent(tmp_path: Path) -> None:
    assert _train(tmp_path, "zloss_window") == []


def test_a_none_loss_averaged_per_micro_batch_then_over_k_is_f5(tmp_path: Path) -> None:
    errors = _train(tmp_path, "micro_mean")
    assert "F5" in [f.cls for f in errors], errors


def test_a_none_loss_summed_over_the_window_is_silent(tmp_path: Path) -> None:
    assert _train(tmp_path, "window_mean") == []


def test_a_mask_applied_after_the_call_counts_the_masked_tokens(tmp_path: Path) -> None:
    """Blind round 51 c_b02: a GRU tagger's ``(nll * mask).sum() / mask.sum()`` per
    micro-batch (Lightning divides by K): the padding positions get gradient 0, the others one
    value; read as a mean over the mask's tokens it is F5, and over the window silent."""
    assert "F5" in [f.cls for f in _train(tmp_path / "micro", "masked_micro_mean")]
    assert _train(tmp_path / "window", "masked_window") == []


def test_per_token_weights_are_not_read_as_one_weight(tmp_path: Path) -> None:
    assert _train(tmp_path, "weighted") == []


def _plain_or_watched(out: Path | None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, V)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run() -> None:
        for window in _batches():
            for x, y in window:
                ce = F.cross_entropy(model(x).transpose(1, 2), y, ignore_index=-100, reduction="none")
                (ce.sum() / 40).backward()
            opt.step()
            opt.zero_grad()
    if out is None:
        run()
    else:
        with recording(out):
            run()
    return [p.detach().clone() for p in model.parameters()]



@pytest.mark.parametrize("where", ["read", "hook"])
def test_a_fault_in_the_none_reading_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The new reading of a ``reduction='none'`` call made to fail, at the call (in the loss
    patch) or in the gradient hook: the run keeps the same bits, and the failure is
    recorded as accumguard's own."""
    from accumguard.observe import _losses

    plain = _plain_or_watched(None)
    if where == "read":
        def broken(*a: object, **kw: object) -> None:
            raise RuntimeError("injected fault in read_class_loss_none")
        monkeypatch.setattr(_losses, "read_class_loss_none", broken)
    else:
        real = _losses.read_class_loss_none

        class BadMask:
            @property
            def shape(self) -> tuple[int, ...]:
                raise RuntimeError("injected fault in the none hook")

        def bad(*a: object, **kw: object) -> object:
            got = real(*a, **kw)  # type: ignore[arg-type]
            return None if got is None else (got[0], got[1], BadMask(), got[3], got[4])
        monkeypatch.setattr(_losses, "read_class_loss_none", bad)
    watched = _plain_or_watched(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    errors = recorded_failures(tmp_path)
    assert errors and "injected fault" in errors[0]["error"], errors
    assert list(load_recordings(tmp_path).failures) == [0]


def test_a_fault_in_the_masked_weight_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight read for a mask applied after the call (``one_weight``, in the gradient
    hook) made to fail: the run keeps the same bits, and the failure is recorded as
    accumguard's own, never as "no finding"."""
    from accumguard.observe import _losses

    plain = _plain_or_watched(None)

    def broken(*a: object, **kw: object) -> None:
        raise RuntimeError("injected fault in one_weight")
    monkeypatch.setattr(_losses, "one_weight", broken)
    watched = _plain_or_watched(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain, strict=True))
    errors = recorded_failures(tmp_path)
    assert errors and "injected fault in one_weight" in errors[0]["error"], errors
    assert list(load_recordings(tmp_path).failures) == [0]
