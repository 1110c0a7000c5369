"""``accumguard demo`` as a library: options, expectations, the summary and the pictures.

The torch engines' loops are audited in test_loops.py and the CLI's quick demo in
test_cli.py; the DeepSpeed matrix and the story run for real in test_demo_story.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accumguard.core.errors import ConfigError
from accumguard.core.taxonomy import fix_for, title
from accumguard.demo import story
from accumguard.demo.console import summary_lines
from accumguard.demo.demo import (
    DemoOptions,
    DemoResult,
    DemoRow,
    demo_setup,
    parse_engines,
)
from accumguard.demo.loops import ENGINES
from accumguard.demo.plots import STORY_PNG, plot_story
from accumguard.demo.story import MATCH_TOLERANCE, WORSE_MARGIN, StoryResult, story_runs


def test_parse_engines() -> None:
    assert parse_engines("ddp") == ("ddp",)
    assert parse_engines("fsdp2, ddp") == ("fsdp2-zero2", "fsdp2-zero3", "ddp")
    assert parse_engines("deepspeed") == ("deepspeed-z1", "deepspeed-z2", "deepspeed-z3")
    assert parse_engines("all") == ENGINES
    with pytest.raises(ConfigError, match="unknown engine 'nccl'"):
        parse_engines("ddp,nccl")
    with pytest.raises(ConfigError, match="selects no engine"):
        parse_engines(",")


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="unknown engine"):
        DemoOptions(engines=("ddp", "bogus"))
    with pytest.raises(ConfigError, match="world_size"):
        DemoOptions(world_size=1)
    assert DemoOptions(quick=True).n_steps == 2 and DemoOptions().n_steps == 3
    with pytest.raises(ConfigError, match="steps"):
        demo_setup(steps=0)


def test_setup_has_uneven_token_counts() -> None:
    setup = demo_setup(steps=2)
    counts = [[int(setup.count_fn(b)) for b in setup.rank_batches(r, 2)] for r in range(2)]
    assert len(counts[0]) == 8
    assert len({c for rank in counts for c in rank}) > 4  # uneven across micro-batches
    assert sum(counts[0]) != sum(counts[1])                # and across ranks
    n = sum(p.numel() for p in setup.build_model().parameters())
    assert 50_000 < n < 1_000_000


def _row(ok: bool | None, verdict: str = "PASS") -> DemoRow:
    return DemoRow(engine="ddp", loop="x", kind="correct", expected="pass", description="",
                   verdict=verdict, as_expected=ok)


def test_exit_code_follows_expectations() -> None:
    def result(*rows: DemoRow) -> DemoResult:
        return DemoResult(rows=list(rows), reports={}, notes=[], elapsed_s=0.0, out_dir=Path())

    assert result(_row(True), _row(None, "SKIP")).exit_code == 0
    assert result(_row(True), _row(False, "FAIL")).exit_code == 1
    assert result(_row(None, "SKIP")).exit_code == 1  # nothing ran: not a success
    failed_story = result(_row(True))
    failed_story.story = _story({"deepspeed-z2/accumulator": 1e-2})
    assert failed_story.exit_code == 1                # a story expectation failed


def test_story_by_default_except_quick() -> None:
    assert DemoOptions().run_story and not DemoOptions(quick=True).run_story
    assert not DemoOptions(story=False).run_story and DemoOptions(quick=True, story=True).run_story


# ----------------------------------------------------------------------------- the story, offline
def _story(offsets: dict[str, float] | None = None, steps: int = 32) -> StoryResult:
    """A story judged from synthetic curves: the reference falls; each run is the reference
    plus ``offsets[key]`` (the hand loop +1.5 unless given)."""
    offsets = {"deepspeed-z2/bug-F2": 1.5, **(offsets or {})}
    ref = [4.0 * 0.95 ** i for i in range(steps + 1)]
    got = {key: [x + offsets.get(key, 0.0) * i / steps for i, x in enumerate(ref)]
           for key, _, _ in story_runs()}
    keys = [key for key, _, _ in story_runs() if key != story.REFERENCE_KEY]
    series = [story._judge(key, label, expected, got, keys)
              for key, label, expected in story_runs()]
    return StoryResult(steps=steps, accumulation_steps=4, world_size=2, micro_batch_rows=4,
                       lr=1.0, eval_sequences=64, eval_tokens=500, series=series, notes=[])


def test_story_judges_each_run_against_the_large_batch() -> None:
    ok = _story()
    assert ok.ok and all(s.as_expected for s in ok.series)
    assert ok.headline() == "ZeRO-2 hand loop: +1.50 loss at step 32; trains on 1/4 of the data"
    # A correct run off by more than the tolerance fails; within it, passes.
    assert not _story({"deepspeed-z2/accumulator": 2 * MATCH_TOLERANCE}).ok
    assert _story({"deepspeed-z2/accumulator": MATCH_TOLERANCE / 2}).ok
    # The hand loop must end clearly worse, not merely different.
    assert not _story({"deepspeed-z2/bug-F2": WORSE_MARGIN / 2}).ok
    assert not _story({"deepspeed-z2/bug-F2": -0.5}).ok
    # A run with another number of optimizer steps than the large batch fails.
    bad = _story()
    got = {s.key: s.eval_loss for s in bad.series}
    got["ddp/accumulator"] = got["ddp/accumulator"][:-1]
    s = story._judge("ddp/accumulator", "x", "match", got, list(got))
    assert s.as_expected is False and "31 optimizer steps" in s.note


def test_story_json_is_strict_and_has_samples() -> None:
    doc = _story().to_dict()
    json.dumps(doc, allow_nan=False)
    by_key = {s["key"]: s for s in doc["series"]}
    f2 = by_key["deepspeed-z2/bug-F2"]
    assert f2["optimizer_steps"] == 32 and len(f2["samples"]) == len(f2["eval_loss"]) == 33
    assert f2["samples"][1] == doc["samples_per_step"] == 32
    nan = _story()
    nan.series[2].eval_loss[-1] = float("nan")
    assert json.dumps(nan.to_dict(), allow_nan=False)


def _broken(engine: str, bug: str, err: float, steps: int = 3) -> DemoRow:
    return DemoRow(engine=engine, loop=f"bug-{bug}", kind="broken", expected=bug,
                   description=f"the {bug} loop", verdict="FAIL", as_expected=True,
                   max_update_error=err, diagnosis=bug, optimizer_steps=steps,
                   reference_steps=3)


def test_summary_is_three_lines_per_class_in_the_taxonomy_words() -> None:
    rows = [_broken("deepspeed-z1", "F2", 0.8), _broken("deepspeed-z2", "F2", 0.81),
            _broken("ddp", "F1", 0.83, steps=12), _row(True)]
    lines = summary_lines(rows, _story())
    assert len(lines) == 6
    f2, how, fix = lines[:3]
    assert f2.startswith("F2 (deepspeed-z1, deepspeed-z2): ") and title("F2") in f2
    assert "81%" in how and "8.1e-01" in how and "+1.50 higher" in how
    assert fix.strip() == f"fix: {fix_for('F2')}"
    assert "12 optimizer steps instead of 3" in lines[4]
    assert lines[5].strip() == f"fix: {fix_for('F1')}"
    assert summary_lines([_row(True)]) == []


def test_pictures_are_written_and_small(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_story(_story(), tmp_path)
    assert path.name == STORY_PNG and 10_000 < path.stat().st_size < 200_000


def test_cli_modules_import_no_optional_dependency() -> None:
    import subprocess
    import sys

    code = ("import sys, accumguard.cli, accumguard.demo.demo, accumguard.demo.loops; "
            "bad = [m for m in ('deepspeed', 'matplotlib', 'rich') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
