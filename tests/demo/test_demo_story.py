"""The demo for real on DeepSpeed ZeRO 1/2/3 plus the story part, read from its JSON report.

ONE demo run for the module (two spawns: the DeepSpeed matrix, then the story's
five runs), shared by every assertion below. Verdicts come from
``demo-report.json``, never from the printed table.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from accumguard.core.taxonomy import fix_for
from accumguard.demo.demo import DemoOptions, DemoResult, parse_engines, run_demo
from accumguard.demo.plots import STORY_PNG, UPDATE_ERROR_PNG

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, dict[str, Any], str]:
    out_dir = tmp_path_factory.mktemp("demo")
    stream = io.StringIO()
    result = run_demo(DemoOptions(engines=parse_engines("deepspeed"), out=out_dir, steps=3,
                                  story=True), stream=stream)
    doc = json.loads((out_dir / "demo-report.json").read_text())
    return result, doc, stream.getvalue()


def _final(doc: dict[str, Any], key: str) -> float:
    series = {s["key"]: s for s in doc["story"]["series"]}
    return float(series[key]["eval_loss"][-1])


def test_exits_0_with_every_verdict_as_expected(demo: tuple[DemoResult, dict[str, Any], str]
                                                ) -> None:
    result, doc, text = demo
    assert result.exit_code == 0, text
    assert doc["passed"] is True and doc["setup"]["story"] is True
    rows = {f"{r['engine']}/{r['loop']}": r for r in doc["rows"]}
    assert all(r["as_expected"] is True for r in rows.values()), text
    for stage in (1, 2, 3):
        assert rows[f"deepspeed-z{stage}/accumulator"]["verdict"] == "PASS"
        assert rows[f"deepspeed-z{stage}/correct"]["verdict"] == "PASS"
    for stage in (1, 2):
        f2 = rows[f"deepspeed-z{stage}/bug-F2"]
        assert f2["verdict"] == "FAIL" and f2["diagnosis"] == "F2"
    # The Accumulator's coalesced path reduces gradients once per optimizer step.
    assert rows["deepspeed-z2/accumulator"]["collectives_per_step"] == 1
    assert doc["story"]["passed"] is True
    assert all(s["as_expected"] is True for s in doc["story"]["series"]), text


def test_story_series_hold_at_least_30_optimizer_steps(
        demo: tuple[DemoResult, dict[str, Any], str]) -> None:
    story = demo[1]["story"]
    assert [s["key"] for s in story["series"]] == [
        "large-batch", "ddp/accumulator", "deepspeed-z2/bug-F2", "deepspeed-z2/accumulator",
        "deepspeed-z2/correct"]
    per_step = story["samples_per_step"]
    assert per_step == 4 * 4 * 2  # micro-batch 4, K=4, W=2: the same for every run
    for s in story["series"]:
        assert s["optimizer_steps"] >= 30, s["key"]
        assert len(s["eval_loss"]) == s["optimizer_steps"] + 1  # step 0 = initial weights
        assert s["samples"] == [i * per_step for i in range(len(s["eval_loss"]))]
        assert all(isinstance(x, float) for x in s["eval_loss"]), s["key"]


def test_zero2_hand_loop_ends_worse_than_the_large_batch(
        demo: tuple[DemoResult, dict[str, Any], str]) -> None:
    _, doc, _ = demo
    ref = _final(doc, "large-batch")
    hand = _final(doc, "deepspeed-z2/bug-F2")
    assert hand > ref + 0.1, (hand, ref)
    steps = doc["story"]["steps"]
    assert doc["story"]["headline"] == (f"ZeRO-2 hand loop: {hand - ref:+.2f} loss at step "
                                        f"{steps}; trains on 1/4 of the data")


def test_accumulator_on_zero2_ends_within_1e3_of_the_large_batch(
        demo: tuple[DemoResult, dict[str, Any], str]) -> None:
    _, doc, _ = demo
    ref = _final(doc, "large-batch")
    for key in ("deepspeed-z2/accumulator", "ddp/accumulator", "deepspeed-z2/correct"):
        assert abs(_final(doc, key) - ref) <= 1e-3, key


def test_output_ends_with_the_three_lines_and_the_pictures_exist(
        demo: tuple[DemoResult, dict[str, Any], str]) -> None:
    result, doc, text = demo
    lines = text.rstrip().splitlines()
    what, how, fix = lines[-3:]
    assert what.startswith("F2 (deepspeed-z1, deepspeed-z2): ")
    assert "by how much:" in how and "higher" in how and "eval loss" in how
    assert fix.strip() == f"fix: {fix_for('F2')}"
    assert doc["story"]["headline"] in text
    for name in (UPDATE_ERROR_PNG, STORY_PNG):
        size = (result.out_dir / name).stat().st_size
        assert 10_000 < size < 300_000, (name, size)
