"""Blind round 128 b_b03, recorded on 2 gloo ranks: a transformers Trainer subclass whose
``training_step`` runs the parent's step (the cross-entropy, divided by K = 4 by the Trainer)
and then a consistency KL term in a backward of its own, ``accelerator.backward(cons)``, not
divided by K: over the window that term weighs 4x its coefficient. Before the rule the run
said only a note (the step's weights total 5, "a constant of the loop, not judged"); the
fixed twin divides the term by ``current_gradient_accumulation_steps``."""

from __future__ import annotations

from accumguard.observe._split_terms_rules import split_term_findings, term_cycle
from tests.helpers import judge_recorded

BUGGY = "r128_hf_consistency_kl_own_backward"
FIXED = "r128_hf_consistency_kl_divided_by_k"


def test_a_term_in_its_own_backward_not_divided_by_k_is_loss_scale() -> None:
    found = judge_recorded(BUGGY)
    errors = [f for f in found if f.severity == "error"]
    assert [f.cls for f in errors] == ["LOSS_SCALE"], errors
    err = errors[0]
    assert err.title == ("a term backpropagated on its own is not divided by K: it weighs 4x "
                         "its coefficient")
    assert "b_b03.py:34, divided by K = 4" in err.evidence
    assert "b_b03.py:64 on its own, times 1 and not divided by K" in err.evidence
    assert "current_gradient_accumulation_steps" in err.fix
    # the whole-loss ledger no longer sums the two terms into "a constant of the loop"
    assert not [f for f in found if f.cls == "LOSS_SCALE" and f.severity == "note"]


def test_the_fixed_twin_is_silent_on_scale() -> None:
    found = judge_recorded(FIXED)
    assert not [f for f in found if f.severity == "error"], found
    # nor a note claiming the two terms' sum (CE 1 + KL 1 = 2 = W) looks like a division by W
    assert not [f for f in found if f.cls in ("LOSS_SCALE", "F10")], found


def _rec(site: str, micro: int, divs: list[list[object]], g: float, n: int = 4) -> list[object]:
    return [site, 0, micro, n, g / n, False, "mean", True, False, divs, "samples", n]


def _window(k: int, aux_divs: list[list[object]], aux_g: float) -> dict[str, object]:
    losses = []
    for m in range(k):
        losses.append(_rec("t.py:10", 2 * m, [["/", float(k)]], 1.0 / k))
        losses.append(_rec("t.py:20", 2 * m + 1, aux_divs, aux_g))
    return {"step": 1, "window": 2 * k, "zero_grads_between": 0, "optimizer_index": None,
            "losses": losses}


def test_the_rule_reads_the_cycle_and_spares_what_it_cannot_prove() -> None:
    bug = [_window(4, [["*", 0.5]], 0.5), _window(4, [["*", 0.5]], 0.5)]
    assert term_cycle(bug[0]["losses"]) == 2  # type: ignore[arg-type]
    assert [f.cls for f in split_term_findings(0, bug)] == ["LOSS_SCALE"]
    # divided by K too: right
    ok = [_window(4, [["*", 0.5], ["/", 4.0]], 0.125)] * 2
    assert split_term_findings(0, ok) == []
    # a coefficient that may hold 1/K (0.1 / 4 = 0.025): not judged
    held = [_window(4, [["*", 0.025]], 0.025)] * 2
    assert split_term_findings(0, held) == []
    # a scale not read all the way (the gradient is not the constants' product): not judged
    unread = [_window(4, [["*", 0.5]], 0.75)] * 2
    assert split_term_findings(0, unread) == []
    # another optimizer in the run: the term may train its parameters at its own rate
    other = [dict(w, optimizer_index=0) for w in bug]
    assert split_term_findings(0, other) == []
    # one window only: not a pattern of the run
    assert split_term_findings(0, bug[:1]) == []
