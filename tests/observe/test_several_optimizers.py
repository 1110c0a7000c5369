"""Each optimizer has its own window (issue 23, item 3 and "Errors on correct loops"):
several optimizers are judged on the backwards that reached their own parameters; FSDP2's
no-op steps on non-final micro-steps are not NO_UPDATE."""

from __future__ import annotations

from typing import Any

from accumguard.observe import rules


def _fsdp_step(step: int, applied: bool, sync: bool) -> dict[str, Any]:
    return {"kind": "step", "rank": 0, "step": step, "backwards": 1, "applied": applied,
            "engine": "fsdp2", "zero_grads_between": 0, "clip_micros": [],
            "sync_micros": [sync], "sync_backward": [sync], "forwards": [1],
            "conservation": None, "source": "torch", "optimizer": "SGD"}


def _analyze(steps: list[dict[str, Any]], k: int | None = None, world: int = 1
             ) -> list[rules.Finding]:
    rec = rules.RunRecording(steps={0: steps}, world=world)
    return rules.analyze(rec, k_flag=k)[0]


def test_fsdp2_step_every_micro_with_sync_at_the_last_is_not_no_update() -> None:
    # set_requires_gradient_sync(is_last), step() + zero_grad() after every micro-batch:
    # FSDP2 hands .grad = None to the three non-final steps (no-ops), the synced one applies
    steps = [_fsdp_step(s, applied=(s % 4 == 3), sync=(s % 4 == 3)) for s in range(12)]
    found = _analyze(steps)
    assert not [f for f in found if f.severity == "error"], found
    (note,) = [f for f in found if f.cls == "OK"]
    assert note.severity == "note"
    assert "9 of 12 optimizer.step() calls" in note.evidence
    assert "did not move" not in note.evidence and "never called" not in note.evidence
    assert "correct" in note.title
    # K is the folded window (4), with or without -k 4
    assert not [f for f in _analyze(steps, k=4) if f.severity == "error"]


def test_fsdp2_that_never_syncs_keeps_no_update() -> None:
    never = [_fsdp_step(s, applied=False, sync=False) for s in range(12)]
    (f,) = [f for f in _analyze(never) if f.severity == "error"]
    assert f.cls == "NO_UPDATE" and "never called" in f.evidence
    # synced windows first, then the run ends on no-op steps no synced backward follows
    tail = [_fsdp_step(s, applied=(s % 4 == 3), sync=(s % 4 == 3)) for s in range(8)] + \
        [_fsdp_step(s, applied=False, sync=False) for s in range(8, 12)]
    (g,) = [f for f in _analyze(tail) if f.severity == "error"]
    assert g.cls == "NO_UPDATE" and g.step == 9 and "last 4 optimizer step(s)" in g.evidence
