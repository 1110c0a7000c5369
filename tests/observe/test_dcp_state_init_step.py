"""``torch.distributed.checkpoint``'s ``set_state_dict`` gives a new optimizer its state by a
step on zero gradients at a zero learning rate (:mod:`accumguard.engines.dcp`). In a run
rebuilt to resume, that step came right after the abandoned run's backward passes: counted as
a window it ended theirs as a short window of the new optimizer and shifted every boundary
after it (blind round 80 b_b03_fixed, FSDP2: a false F13 error). It is no window: a resume
that replays the unfinished window is right, one that skips its saved micro-batches is F13."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K = 3
STEPS = 4
SAVE_AT = 5  # batches: a checkpoint in the middle of the second window, then preempted


def _build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def _train(replay: bool) -> list[torch.Tensor]:
    model, opt = _build()
    i, step, saved, resumed = 0, 0, None, False
    while i < STEPS * K:
        x, y = _batch(i)
        (F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
            step += 1
        i += 1
        if i == SAVE_AT and not resumed:
            msd, osd = get_state_dict(model, opt)
            saved = {"model": msd, "opt": osd, "i": i, "step": step}
            resumed = True
            del model, opt  # preempted; a new process would build everything again
            model, opt = _build()
            set_state_dict(model, opt, model_state_dict=saved["model"],
                           optim_state_dict=saved["opt"])
            i = saved["step"] * K if replay else saved["i"]
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("replay", "errors"), [(True, []), (False, ["F13"])],
                         ids=["window_replayed", "saved_micro_batches_skipped"])
def test_dcps_state_initialisation_is_no_window(tmp_path: Path, replay: bool,
                                                 errors: list[str]) -> None:
    plain = _train(replay)
    with recording(tmp_path):
        seen = _train(replay)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    found, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    bad: list[Any] = [f for f in found if f.severity == "error"]
    assert sorted({f.cls for f in bad}) == errors, bad


def test_a_fault_in_the_state_step_handling_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault where the observer ends the window at DCP's state step (inside the optimizer's
    pre-step hook, in the user's process): observation switches off, the failure is
    accumguard's, the weights are bit-equal to the unobserved run."""
    from accumguard.observe._observer import Observer

    def broken(self: Any, opt: Any) -> None:
        raise RuntimeError("injected: DCP's state step")

    plain = _train(True)
    monkeypatch.setattr(Observer, "_state_init_step", broken)
    with recording(tmp_path) as obs:
        seen = _train(True)
        failure = obs.failure
    assert failure is not None and "injected" in failure.error + failure.traceback
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
