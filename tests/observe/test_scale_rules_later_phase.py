"""LOSS_SCALE (divided by K twice) judged per optimizer object: a single-process reference
run after the training, in the same process and with windows of K backwards of its own
that weigh 1, does not hide the training's windows weighing 1/K (blind round 78 a_b03: an
HF Trainer subclass's ``training_step`` dividing by ``gradient_accumulation_steps`` a loss
already over ``num_items_in_batch``, missed before). The training alone weighing 1 stays
silent."""

from __future__ import annotations

from typing import Any

from accumguard.watch._findings import RunRecording, analyze

K = 4


def _step(step: int, serial: int, mass: float) -> dict[str, Any]:
    counts = [9, 12, 19, 19]
    total = sum(counts)
    losses = [["/x/train.py:40", 0, m, n, mass / total, False, "sum", True, False,
               [["/", float(total)]], "tokens", n] for m, n in enumerate(counts)]
    return {"kind": "step", "rank": 0, "step": step, "backwards": K, "applied": True,
            "engine": "local", "optimizer": "SGD", "opt_serial": serial, "losses": losses,
            "conservation": {"params": 4, "wiped": 0.0, "stale": 0.0, "received": 0.0,
                             "ok": True, "reason": "", "scale": 1.0}}


def _errors(train_mass: float) -> list[Any]:
    lines = [_step(i, 1, train_mass) for i in range(3)] + [_step(3 + i, 2, 1.0) for i in range(3)]
    rec = RunRecording(steps={0: lines}, world=1, end={0: {"kind": "end"}})
    found, _, _ = analyze(rec, k_flag=K)
    return [f for f in found if f.severity == "error"]


def test_the_training_divided_by_k_twice_beside_a_right_reference_is_loss_scale() -> None:
    errors = _errors(1.0 / K)
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    assert errors[0].title.startswith("the loss is divided by K twice"), errors[0]


def test_a_right_training_and_reference_say_nothing() -> None:
    assert _errors(1.0) == []
