"""K inferred from the observed windows when nothing declares it: the most common window,
and on a tie the declared K of the script when it is one of the tied sizes, else the
largest (a resumed run's first window is a partial one: blind round 24, a correct resume
of 2 + 4 micro-steps was judged at K = 2, an F7 and a LOSS_SCALE error)."""

from __future__ import annotations

from typing import Any

from accumguard.observe import rules
from accumguard.watch._declared import ScriptK


def _step(step: int, backwards: int) -> dict[str, Any]:
    return {"kind": "step", "rank": 0, "step": step, "backwards": backwards, "applied": True,
            "engine": "local", "zero_grads_between": 0, "clip_micros": [],
            "sync_micros": [None] * backwards, "forwards": [1] * backwards,
            "conservation": None, "source": "torch", "optimizer": "SGD"}


def _k(sizes: list[int], script: int | None = None) -> int | None:
    rec = rules.RunRecording(steps={0: [_step(i, n) for i, n in enumerate(sizes)]})
    declared = None if script is None else ScriptK(name="K", value=script, path="t.py", line=1,
                                                   how="assignment", divides_loss=True)
    return rules.resolve_k(rec, None, declared).k


def test_the_most_common_window_is_k() -> None:
    assert _k([4, 4, 2]) == 4 and _k([3, 3, 3, 4]) == 3


def test_a_tie_goes_to_the_declared_k_else_to_the_largest() -> None:
    assert _k([2, 4]) == 4
    assert _k([2, 4], script=4) == 4
    assert _k([4, 2, 2, 4], script=2) == 2


def _k_phases(phases: list[tuple[int, list[int]]]) -> int | None:
    steps = []
    for serial, sizes in phases:
        steps += [dict(_step(len(steps), n), opt_serial=serial) for n in sizes]
    return rules.resolve_k(rules.RunRecording(steps={0: steps}), None, None).k


def test_a_reference_phase_with_its_own_optimizer_does_not_make_k_one() -> None:
    # blind round 51 c_b01: the training's windows 4, 4, 6, 4 with one optimizer, then a
    # large-batch reference of 5 single-backward steps with a new one: K = 4, not 1
    assert _k_phases([(1, [4, 4, 6, 4]), (2, [1, 1, 1, 1, 1])]) == 4
    # the same sizes from one optimizer object: the most common window
    assert _k_phases([(1, [4, 4, 6, 4, 1, 1, 1, 1, 1])]) == 1
    # optimizers that alternate are no sequential phases
    assert _k_phases([(1, [4]), (2, [1]), (1, [4]), (2, [1]), (2, [1])]) == 1
