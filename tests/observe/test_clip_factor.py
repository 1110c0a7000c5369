"""The clip's own factor that the loss-weight ledger divides out is read inside the
optimizer-step hook, in the user's process (``_steps._clip_coefficient``, on a checked
window whose last backward a norm clip followed). It is read from the norm the clip
returned, after the clip ran: the watched run is bit-identical to the unwatched one, and an
internal error there switches observation off, is recorded as accumguard's own failure,
and the run trains on with the same bits."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch import recording

K, STEPS, MAX_NORM = 3, 3, 1e-3  # a max_norm that always bites: factor < 1


def _run(out: Path | None, failures: list[object] | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g))
            for _ in range(STEPS * K)]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with recording(out) if out is not None else contextlib.nullcontext() as obs:
        for i, (x, y) in enumerate(data):
            (F.mse_loss(model(x), y) / K).backward()
            if (i + 1) % K == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
                opt.step()
                opt.zero_grad()
    if obs is not None and failures is not None:
        failures.append(obs.failure)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_the_clip_factor_is_recorded_and_the_run_is_unchanged(tmp_path: Path) -> None:
    assert torch.equal(_run(None), _run(tmp_path))
    clips = [json.loads(line)["conservation"]["clip"]
             for f in tmp_path.glob("rank-*.jsonl") for line in f.read_text().splitlines()
             if json.loads(line).get("kind") == "step"
             and json.loads(line).get("conservation")]
    # (the first window is not checked: no conservation verdict, no factor read)
    assert len(clips) == STEPS - 1 and all(0.0 < c < 1.0 for c in clips), clips


def test_a_fault_in_reading_the_clip_factor_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accumguard.observe import _steps

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected: clip factor")

    plain = _run(None)
    monkeypatch.setattr(_steps, "_clip_coefficient", boom)
    failures: list[object] = []
    watched = _run(tmp_path, failures)
    assert torch.equal(plain, watched)
    assert failures and failures[0] is not None, "the injected fault did not fire"
    assert "injected: clip factor" in str(failures[0]), failures[0]
