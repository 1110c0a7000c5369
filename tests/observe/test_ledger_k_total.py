"""The loss-weight ledger on 2 ranks: a loss normalised by the window's token count over
all ranks and multiplied by W (right under DDP's average), returned to a framework that
divides it by its accumulation steps (Lightning's automatic optimisation; blind round 36
a_b03): every step's tokens weigh 1/K in total across the ranks, and each micro-step's
loss carries a division by exactly K. LOSS_SCALE error; the same loss with the K put back
(total 1) is silent, and a total of 1/K with no division by K in the constants (a loss
weight the user chose) is not called a K error."""

from __future__ import annotations

from typing import Any

from accumguard.observe.rules import RunRecording, analyze

K, W = 3, 2
COUNTS = {0: [[22, 26, 12], [20, 25, 30]], 1: [[23, 19, 26], [21, 17, 30]]}


def _rec(div_k: bool, times_k: bool) -> RunRecording:
    steps: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for step in range(2):
        n = sum(sum(COUNTS[r][step]) for r in (0, 1))
        consts: list[list[Any]] = ([["/", float(K)]] if div_k else []) + [["*", float(W)],
                                                                          ["/", float(n)]]
        if times_k:
            consts.append(["*", float(K)])
        w = (W / n) * (1 / K if div_k else 1.0) * (K if times_k else 1.0)
        for r in (0, 1):
            losses = [["train.py:78", 0, m, c, w, False, "sum", True, False, consts, "tokens"]
                      for m, c in enumerate(COUNTS[r][step])]
            steps[r].append({"step": step, "backwards": K, "engine": "ddp", "optimizer": "SGD",
                             "zero_grads_between": 0, "losses": losses, "rank_factor": 0.5,
                             "opt_serial": 1, "applied": True,
                             "conservation": {"params": 5, "wiped": 0.0, "stale": 0.0,
                                              "received": 0.0, "ok": True, "reason": "",
                                              "first_wipe": None, "wipes": [], "lost": 0.0,
                                              "scale": 1.0}})
    return RunRecording(steps=steps, world=W)


def _errors(rec: RunRecording) -> list[Any]:
    return [f for f in analyze(rec, k_flag=K)[0] if f.severity.value == "error"]


def test_a_window_normalised_loss_divided_by_k_again_is_loss_scale() -> None:
    (f,) = _errors(_rec(div_k=True, times_k=False))
    assert f.cls == "LOSS_SCALE" and "1/3" in f.title and "too small" in f.title, f
    assert "normalisation over the window's tokens on all ranks" in f.evidence, f.evidence


def test_the_same_loss_with_k_put_back_is_silent() -> None:
    assert _errors(_rec(div_k=True, times_k=True)) == []


def test_a_total_of_one_over_k_without_a_division_by_k_is_not_called_one() -> None:
    rec = _rec(div_k=True, times_k=False)
    for lines in rec.steps.values():
        for line in lines:
            for loss in line["losses"]:
                loss[9] = [["*", 1.0 / K] if c == ["/", float(K)] else c for c in loss[9]]
    assert [f for f in _errors(rec) if f.cls == "LOSS_SCALE"] == []


def test_a_step_after_every_backward_is_left_to_f1() -> None:
    """Each micro-step's loss / K stepped alone (F1): a total of 1/K per step is F1's to
    say; the ledger does not add a second, untrue reason ("normalised over the window")."""
    rec = _rec(div_k=True, times_k=False)
    for lines in rec.steps.values():
        for line in lines:
            line["losses"] = line["losses"][:1]
            line["backwards"] = 1
    assert [f for f in _errors(rec) if f.cls == "LOSS_SCALE" and f.rank is None] == []
