"""Data parallelism written by hand whose all-reduce covers only some parameters (blind round
87 c_b01: the loop iterates over ``optimizer.param_groups[0]`` only, so the no-decay group is
never averaged): each rank's optimizer receives its own gradient for those parameters. That is
F10 naming them, not the generic F11 "ranks train different models" (no sync flag is involved).
The fixed twin reduces every group and has no finding of the kind. The rules run in this
process on the first three steps of the two runs' recordings (2 ranks on gloo, ``watch
--keep``, kept in ``recorded/``)."""

from __future__ import annotations

from helpers import judge_recorded


def _findings(name: str) -> list:
    return judge_recorded(name, 4)


def test_parameters_the_hand_all_reduce_skips_are_named() -> None:
    findings = _findings("r87_hand_reduce_skips_a_group")
    errors = [f for f in findings if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], findings
    assert "21 parameters are never averaged" in errors[0].title
    # the no-decay group: embeddings, LayerNorms and biases, by name from the end line
    for name in ("wte.weight", "h.0.ln_1.bias", "h.0.attn.in_proj_bias"):
        assert name in errors[0].evidence, errors[0].evidence
    assert "0.5 x the sum over ranks" in errors[0].evidence


def test_every_group_reduced_is_silent() -> None:
    findings = _findings("r87_hand_reduce_every_group")
    assert not [f for f in findings if f.severity == "error"], findings
    assert not [f for f in findings if f.cls in ("F10", "F11")], findings


def test_an_all_reduce_that_never_reaches_the_gradients_is_f10() -> None:
    """Blind round 89 c_b01: the parameters are gathered from a generator, which the loop
    collecting the gradients to reduce consumes, so the loop copying the reduced values back
    runs zero times: the window issues its collectives, yet each rank's optimizer receives
    its own gradient (a clip after it rescales it). F10, not the generic F11."""
    findings = _findings("r89_hand_reduce_of_a_spent_generator")
    errors = [f for f in findings if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], findings
    assert "never reaches the gradients the optimizer steps" in errors[0].title


def test_skipped_parameters_are_named_behind_a_clip_that_acts() -> None:
    """Blind round 113 c_b01: nanoGPT's two groups, the helper rebuilds its list inside the
    loop over ``param_groups`` and reduces after it (only the last, no-decay group), then a
    clip at 1.0 that acts (a factor of about 0.8, different on each rank): each rank's
    optimizer receives its own gradient times its clip factor for the weights. The factors
    are the ones the never-reduced parameters share; the reduced ones agree after them."""
    errors = [f for f in _findings("r113_hand_reduce_last_group_clipped") if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "never averaged" in errors[0].title
    for name in ("transformer.wte.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.weight"):
        assert name in errors[0].evidence, errors[0].evidence
    assert "ln_1.bias" not in errors[0].evidence.split("never covered")[1]


def test_every_group_reduced_behind_a_clip_is_silent() -> None:
    findings = _findings("r113_hand_reduce_all_groups_clipped")
    assert not [f for f in findings if f.severity != "note"], findings
