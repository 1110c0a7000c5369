"""``accumguard demo`` as a library: options, expectations, and the DeepSpeed matrix.

The torch engines' loops are audited in test_loops.py and the CLI's quick demo in
test_cli.py; here the slow test runs the demo on DeepSpeed ZeRO 1/2/3 for real
(one spawn: Accumulator, native-GA loop, the seed's GA=1 bug F2).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from accumguard.core.errors import ConfigError
from accumguard.demo.demo import (
    DemoOptions,
    DemoResult,
    DemoRow,
    demo_setup,
    parse_engines,
    run_demo,
)
from accumguard.demo.loops import ENGINES


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


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.deepspeed
def test_demo_on_deepspeed(tmp_path: Path) -> None:
    stream = io.StringIO()
    result = run_demo(DemoOptions(engines=parse_engines("deepspeed"), out=tmp_path,
                                  steps=3, plot=False), stream=stream)
    text = stream.getvalue()
    assert result.exit_code == 0, text
    by_key = {r.key: r for r in result.rows}
    for stage in (1, 2, 3):
        assert by_key[f"deepspeed-z{stage}/accumulator"].verdict == "PASS", text
        assert by_key[f"deepspeed-z{stage}/correct"].verdict == "PASS", text
    for stage in (1, 2):
        f2 = by_key[f"deepspeed-z{stage}/bug-F2"]
        assert f2.verdict == "FAIL" and f2.diagnosis == "F2", text
    # The Accumulator's coalesced path reduces gradients once per optimizer step.
    assert by_key["deepspeed-z2/accumulator"].collectives_per_step == 1
    doc = json.loads((tmp_path / "demo-report.json").read_text())
    assert doc["passed"] is True and len(doc["rows"]) == len(result.rows)


def test_cli_modules_import_no_optional_dependency() -> None:
    import subprocess
    import sys

    code = ("import sys, accumguard.cli, accumguard.demo.demo, accumguard.demo.loops; "
            "bad = [m for m in ('deepspeed', 'matplotlib', 'rich') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
