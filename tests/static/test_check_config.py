"""DeepSpeed config checks: parsing (comments, errors with line numbers) and each finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accumguard.cli.lint import check_config_main
from accumguard.core.errors import ConfigError
from accumguard.static.dsconfig import (
    ConfigDict,
    ConfigParseError,
    check_config,
    load_config,
    parse_config_text,
    resolved_accumulation_steps,
)

GOOD = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "train_batch_size": 64,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "data_types": {"grad_accum_dtype": "fp32"},
    "zero_optimization": {"stage": 2, "overlap_comm": True},
}


def codes(cfg: dict, **kw: object) -> list[str]:
    return [f.code for f in check_config(cfg, **kw)]  # type: ignore[arg-type]


def write(tmp_path: Path, text: str, name: str = "ds.json") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ---------------------------------------------------------------- parsing


def test_comments_and_trailing_commas_parse(tmp_path: Path) -> None:
    text = """{
  // line comment
  "train_micro_batch_size_per_gpu": 4,  # hash comment
  /* block
     comment */
  "gradient_clipping": 0.5,
  "note": "http://not/a // comment # either /* */",
  "zero_optimization": {"stage": 2,},
}
"""
    cfg = load_config(write(tmp_path, text))
    assert cfg["note"] == "http://not/a // comment # either /* */"
    assert cfg["zero_optimization"] == {"stage": 2}
    assert cfg.key_lines[("gradient_clipping",)] == 6
    assert cfg.key_lines[("zero_optimization", "stage")] == 8


def test_parse_error_reports_original_line(tmp_path: Path) -> None:
    text = """{
  /* a comment
     spanning lines */
  "train_batch_size": 32,  // fine
  "gradient_accumulation_steps" 4
}
"""
    with pytest.raises(ConfigParseError) as info:
        load_config(write(tmp_path, text))
    assert info.value.line == 5
    assert str(info.value).startswith(f"{tmp_path / 'ds.json'}:5:")


def test_top_level_must_be_object() -> None:
    with pytest.raises(ConfigParseError, match="is an object"):
        parse_config_text("[1, 2]")


def test_missing_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.json")


def test_dict_passes_through() -> None:
    cfg = load_config({"train_batch_size": 8})
    assert isinstance(cfg, dict) and isinstance(cfg, ConfigDict) and cfg == {"train_batch_size": 8}


# ---------------------------------------------------------------- checks


def test_good_config_is_clean() -> None:
    assert check_config(GOOD, world_size=2, accumulation_steps=8) == []


def test_missing_clipping_is_f9() -> None:
    cfg = {k: v for k, v in GOOD.items() if k != "gradient_clipping"}
    (f,) = check_config(cfg, world_size=2)
    assert f.code == "AG203" and "1.0" in f.message and f.severity.value == "warning"


def test_batch_arithmetic_wrong_with_world_size() -> None:
    (f,) = check_config({**GOOD, "train_batch_size": 48}, world_size=2)
    assert f.code == "AG201" and f.key == "train_batch_size"
    assert "48" in f.message and "64" in f.message and "64" in f.fix


def test_batch_arithmetic_without_world_size_needs_a_multiple() -> None:
    assert codes({**GOOD, "train_batch_size": 96}) == []  # W = 3 fits
    assert codes({**GOOD, "train_batch_size": 100}) == ["AG201"]


def test_derived_ga_not_integral() -> None:
    cfg = {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0}
    assert codes(cfg, world_size=2) == ["AG201"]


def test_no_batch_size_at_all() -> None:
    assert codes({"gradient_accumulation_steps": 2, "gradient_clipping": 0}) == ["AG201"]


def test_invalid_value() -> None:
    assert "AG200" in codes({**GOOD, "gradient_accumulation_steps": 0})
    assert "AG200" in codes({**GOOD, "train_micro_batch_size_per_gpu": "four"})


def test_auto_values_are_info_not_arithmetic() -> None:
    cfg = {**GOOD, "train_batch_size": "auto", "gradient_accumulation_steps": "auto"}
    (f,) = check_config(cfg, world_size=2, accumulation_steps=8)
    assert f.code == "AG207" and f.severity.value == "note"


def test_ga_one_with_accumulating_loop_is_f2() -> None:
    cfg = {**GOOD, "gradient_accumulation_steps": 1, "train_batch_size": 8}
    found = check_config(cfg, world_size=2, accumulation_steps=4)
    (f,) = [f for f in found if f.code == "AG202"]
    assert f.severity.value == "error" and "last micro-batch" in f.message
    assert '"gradient_accumulation_steps": 4' in f.fix


def test_ga_absent_with_accumulating_loop_is_f2() -> None:
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.0}
    assert codes(cfg, accumulation_steps=4) == ["AG202"]
    assert resolved_accumulation_steps(cfg) == 1


def test_ga_mismatch_other_than_one() -> None:
    assert codes(GOOD, world_size=2, accumulation_steps=4) == ["AG202"]


def test_coalesced_loop_requires_ga_one() -> None:
    assert "AG202" in codes(GOOD, world_size=2, accumulation_steps=8, coalesced=True)
    cfg = {**GOOD, "gradient_accumulation_steps": 1, "train_batch_size": 8}
    assert "AG202" not in codes(cfg, world_size=2, accumulation_steps=8, coalesced=True)


def test_bf16_accumulation_dtype() -> None:
    cfg = {k: v for k, v in GOOD.items() if k != "data_types"}
    assert codes(cfg, world_size=2) == ["AG204"]
    assert codes({**cfg, "data_types": {"grad_accum_dtype": "bf16"}}, world_size=2) == ["AG204"]
    # GA 1: nothing is accumulated in low precision
    cfg1 = {**cfg, "gradient_accumulation_steps": 1, "train_batch_size": 8}
    assert codes(cfg1, world_size=2) == []


def test_zero2_reductions_per_micro_step_is_info() -> None:
    cfg = {**GOOD, "zero_optimization": {"stage": 2}}
    (f,) = check_config(cfg, world_size=2)
    assert f.code == "AG205" and f.severity.value == "note"
    assert "coalesce_grad_reduction" in f.fix and "docs/performance.md" in f.fix


def test_misspelled_key_suggests(tmp_path: Path) -> None:
    text = json.dumps({**GOOD, "gradient_accumulation_step": 8}, indent=1)
    cfg = load_config(write(tmp_path, text))
    (f,) = [f for f in check_config(cfg, world_size=2) if f.code == "AG206"]
    assert "did you mean `gradient_accumulation_steps`" in f.message
    assert f.line == text.splitlines().index(' "gradient_accumulation_step": 8') + 1


def test_a_misspelled_key_carries_the_failure_its_absence_causes() -> None:
    """The clip key misspelled leaves DeepSpeed's default clip (F9); the accumulation key
    misspelled with no train_batch_size leaves GA 1, so every engine.step() steps (F1); with
    the key it meant also set, or a train_batch_size that gives the window, no class."""
    base = {k: v for k, v in GOOD.items()
            if k not in ("gradient_accumulation_steps", "train_batch_size", "gradient_clipping")}

    def cls_of(cfg: dict[str, object]) -> str:
        (f,) = [f for f in check_config(cfg, world_size=2) if f.code == "AG206"]
        return f.cls

    assert cls_of({**base, "gradient_clip": 0.0, "gradient_accumulation_steps": 4}) == "F9"
    assert cls_of({**base, "gradient_clip": 0.0, "gradient_clipping": 0.0,
                   "gradient_accumulation_steps": 4}) == ""
    assert cls_of({**base, "gradient_clipping": 1.0, "gradient_accumulation_step": 4}) == "F1"
    assert cls_of({**base, "gradient_clipping": 1.0, "gradient_accumulation_step": 4,
                   "train_batch_size": 64}) == ""


def test_a_clip_written_under_a_key_deepspeed_ignores_is_an_error() -> None:
    """The script wrote its clip (0: none) where DeepSpeed never reads it, and DeepSpeed clips
    at its default 1.0: an F9 error. A value of 1.0 (what runs anyway) or a
    `gradient_clipping` beside it is no error."""
    base = {k: v for k, v in GOOD.items() if k != "gradient_clipping"}

    def ag206(cfg: dict[str, object]) -> list[tuple[str, str]]:
        return [(f.cls, f.severity.value) for f in check_config(cfg, world_size=2)
                if f.code == "AG206"]

    assert ag206({**base, "max_grad_norm": 0.0}) == [("F9", "error")]
    assert ag206({**base, "grad_clip": 5}) == [("F9", "error")]
    assert ag206({**base, "gradient_clip": 1.0}) == [("F9", "warning")]
    assert ag206({**base, "max_grad_norm": 0.0, "gradient_clipping": 0.0}) == [("", "warning")]


def test_misspelled_nested_key() -> None:
    cfg = {**GOOD, "data_types": {"grad_acum_dtype": "fp32"}}
    found = check_config(cfg, world_size=2)
    assert any(f.code == "AG206" and "data_types.grad_accum_dtype" in f.message for f in found)


def test_unrelated_unknown_keys_are_not_reported() -> None:
    assert codes({**GOOD, "my_custom_logging": {"x": 1}, "flops_profiler": {}}, world_size=2) == []


def test_bad_arguments_raise() -> None:
    with pytest.raises(ConfigError, match="world_size"):
        check_config(GOOD, world_size=0)


def test_finding_points_at_key_line(tmp_path: Path) -> None:
    text = '{\n  "train_batch_size": 48,\n  "train_micro_batch_size_per_gpu": 4,\n' \
        '  "gradient_accumulation_steps": 8,\n  "gradient_clipping": 1\n}\n'
    (f,) = check_config(load_config(write(tmp_path, text)), world_size=2)
    assert (f.code, f.line, f.path) == ("AG201", 2, str(tmp_path / "ds.json"))


# ---------------------------------------------------------------- CLI


def test_cli_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, json.dumps(GOOD))
    assert check_config_main([str(p), "--world-size", "2", "--accumulation-steps", "8"]) == 0
    assert capsys.readouterr().out == ""


def test_cli_findings_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, json.dumps({**GOOD, "train_batch_size": 48}, indent=1))
    assert check_config_main([str(p), "--world-size", "2"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{p}:4:1: AG201 ")  # train_batch_size is the third key


def test_cli_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, json.dumps({k: v for k, v in GOOD.items() if k != "gradient_clipping"}))
    assert check_config_main([str(p), "--format", "json"]) == 1
    (item,) = json.loads(capsys.readouterr().out)["findings"]
    assert item["code"] == "AG203" and item["failure_class"] == "F9"
    assert check_config_main([str(p), "--format", "sarif"]) == 1
    log = json.loads(capsys.readouterr().out)
    assert log["runs"][0]["results"][0]["ruleId"] == "AG203"


def test_cli_select_ignore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, json.dumps({k: v for k, v in GOOD.items() if k != "gradient_clipping"}))
    assert check_config_main([str(p), "--ignore", "AG203"]) == 0
    assert check_config_main([str(p), "--select", "AG2"]) == 1
    capsys.readouterr()


def test_cli_parse_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, '{\n  // c\n  "a": 1\n  "b" 2\n}\n')  # no colon: hjson refuses
    assert check_config_main([str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{p}:4:")


def test_cli_bad_world_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, json.dumps(GOOD))
    assert check_config_main([str(p), "--world-size", "0"]) == 2
    assert "--world-size" in capsys.readouterr().err


def test_corpus_configs_check_as_documented() -> None:
    corpus = Path(__file__).resolve().parents[1] / "lint_corpus"
    assert check_config_main([str(corpus / "ds_config_ga4.json"), "--accumulation-steps", "4"]) == 0
    assert check_config_main([str(corpus / "ds_config_ga1.json"), "--accumulation-steps", "4"]) == 1


# ---------------------------------------------------------------- read exactly as DeepSpeed reads


def deepspeed_reads(text: str) -> dict | None:
    """What DeepSpeed 0.19.8's DeepSpeedConfig does with a config file's text, or None if it fails."""
    import hjson
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys

    try:
        data = hjson.loads(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)
    except Exception:  # noqa: BLE001 - hjson also crashes (IndexError on "[" + "'''x'''"): refused
        return None
    return data if isinstance(data, dict) else None


def ours_reads(text: str) -> dict | None:
    try:
        return dict(parse_config_text(text))
    except ConfigParseError:
        return None


PARITY_CASES = [
    '{"train_batch_size": 8}',
    "{train_batch_size: 8, zero_optimization: {stage: 2}}",
    "train_batch_size: 8\nzero_optimization: {\n  stage: 2\n}\n",  # root braces omitted
    "{\n  # hash\n  // slashes\n  /* block */\n  gradient_clipping: 1.0,\n}",
    "{\n  a: quoteless string value\n  b: 'single'\n  c: '''\n    multi\n    '''\n}",
    '{"a": 1, "a": 2}',  # duplicate: DeepSpeed refuses
    "{zero_optimization: {stage: 1, stage: 2}}",  # nested duplicate
    '{"a": 1 "b": 2}',
    "{\n\"a\": 1\n\"b\": 2\n}",  # newline separates members in hjson
    "{a b: 1}",
    "[1, 2]",
    "",
    "{a: {b: [1, {c: 2}, 3]}}",
    '{"a": auto}',
    "{a: 1}}",
    '{"train_batch_size": 8, "note": "// not a comment # either"}',
    "[" + "'" * 3 + "x" + "'" * 3,  # hjson itself raises IndexError here; we report a parse error
]


@pytest.mark.parametrize("text", PARITY_CASES)
def test_same_acceptance_and_values_as_deepspeed(text: str) -> None:
    assert ours_reads(text) == deepspeed_reads(text)


def test_unquoted_hjson_config_keeps_original_lines(tmp_path: Path) -> None:
    text = "# DeepSpeed config\n{\n  train_micro_batch_size_per_gpu: 4\n  // GA below\n" \
        "  gradient_accumulation_steps: 8\n  train_batch_size: 48\n  zero_optimization: {\n" \
        "    stage: 2\n  }\n}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.key_lines[("gradient_accumulation_steps",)] == 5
    assert cfg.key_lines[("zero_optimization", "stage")] == 8
    found = {f.code: f.line for f in check_config(cfg, world_size=2)}
    assert found["AG201"] == 6 and found["AG203"] is None


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ('{\n  "train_batch_size": 8,\n  "gradient_clipping": 1,\n  "train_batch_size": 16\n}', "train_batch_size", (2, 4)),
        ("{\n  zero_optimization: {\n    stage: 1\n    stage: 2\n  }\n}", "zero_optimization.stage", (3, 4)),
    ],
)
def test_duplicate_keys_refused_with_both_lines(tmp_path: Path, text: str, key: str,
                                                lines: tuple[int, int],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigParseError) as info:
        parse_config_text(text)
    assert info.value.line == lines[1]
    assert f"`{key}`" in str(info.value) and f"lines {lines[0]} and {lines[1]}" in str(info.value)
    p = write(tmp_path, text)
    assert check_config_main([str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{p}:{lines[1]}:1: duplicate key")
    assert "Traceback" not in err


def test_config_parse_error_is_a_lint_error() -> None:
    from accumguard.core.errors import AccumguardError, ConfigError, LintError

    with pytest.raises(LintError) as info:
        parse_config_text("{a: 1}}")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, AccumguardError)


_PIECES = [
    "{", "}", "[", "]", ",", ":", "\n", " ", "#c\n", "//c\n", "/*c*/", "'''x'''", '"k"', "'k'",
    "stage", "train_batch_size", "a", "b", "1", "-3", "2.5", "true", "null", "x y", '"\\u00e9"',
    '"a\\"b"', "\t", "auto",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_random_hjson_like_text_parity_with_deepspeed(pieces: list[str]) -> None:
    """Random near-hjson text: we accept exactly what DeepSpeed accepts, with the same values."""
    text = "".join(pieces)
    assert ours_reads(text) == deepspeed_reads(text)
