"""Data parallelism by hand whose short window is divided by a full window's size after the
all-reduce (blind round 75 b_b02: summed losses, one flat all_reduce(SUM), then
``/ (world * micro_bs * K)`` on every window, the epoch's tail included; missed before:
no loss record shows a division, it is applied to the reduced gradient). What the optimizer
received, fitted against every rank's backwards, weighs the full windows 1 and the tail
n_tail / n_full: F7. The same loop dividing by the all-reduced count of what the window
held stays silent."""

from __future__ import annotations

from typing import Any

from accumguard.watch._findings import RunRecording, analyze

K, MICRO, WORLD = 4, 4, 2


def _step(rank: int, step: int, n: int, rows: list[int], divisor: float,
          start: bool) -> dict[str, Any]:
    # rank r's contribution per parameter checksum; received = (sum over ranks) / divisor
    contrib = [float(rank + 1 + step), -0.5 * (rank + 1), 2.0 + step, 0.25 * (step + 1)]
    both = [sum(float(r + 1 + step) for r in range(WORLD)),
            sum(-0.5 * (r + 1) for r in range(WORLD)), WORLD * (2.0 + step),
            WORLD * 0.25 * (step + 1)]
    losses = [["/x/train.py:45", 0, m, rows[m], 1.0, False, "sum", True, False, [], "tokens"]
              for m in range(n)]
    return {"kind": "step", "rank": rank, "step": step, "backwards": n, "applied": True,
            "engine": "local", "reductions": 2, "clips": 0,
            "data_pass_starts": [0] if start else [], "losses": losses,
            "conservation": {"params": 4, "wiped": 0.0, "stale": 0.0, "received": 0.9,
                             "ok": True, "reason": "", "scale": 0.1,
                             "contrib_sums": contrib,
                             "received_sums": [x / divisor for x in both]}}


def _findings(own_count: bool) -> list[Any]:
    # two epochs of windows 4, 2 micro-batches; the tail's second micro-batch holds 2 rows
    shapes = [(4, [4, 4, 4, 4]), (2, [4, 2]), (4, [4, 4, 4, 4]), (2, [4, 2])]
    steps: dict[int, list[dict[str, Any]]] = {}
    for rank in range(WORLD):
        lines = []
        for i, (n, rows) in enumerate(shapes):
            held = WORLD * sum(rows)
            divisor = float(held) if own_count else float(WORLD * MICRO * K)
            lines.append(_step(rank, i, n, rows, divisor, start=i in (0, 2)))
        steps[rank] = lines
    rec = RunRecording(steps=steps, world=WORLD, end={r: {"kind": "end"} for r in range(WORLD)})
    found, _, _ = analyze(rec, k_flag=K)
    return [f for f in found if f.severity == "error"]


def test_a_short_window_divided_by_the_full_size_after_a_hand_reduce_is_f7() -> None:
    errors = _findings(own_count=False)
    assert [f.cls for f in errors] == ["F7"], errors
    assert errors[0].step == 2 and errors[0].title.startswith(
        "a short window (2 of K = 4 micro-steps) scaled as a full one: its update is 0.375"), errors[0]
    assert "end of a pass over the DataLoader" in errors[0].evidence


def test_the_same_loop_dividing_by_what_the_window_held_is_silent() -> None:
    assert _findings(own_count=True) == []
