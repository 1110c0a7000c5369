"""The ``accumguard`` CLI, in-process: exit codes, the demo table's key lines, the JSON schema.

``accumguard demo --quick`` runs once for the module (2 real gloo ranks: DDP and
ZeRO-1, Accumulator, a correct loop and broken loops, 2 optimizer steps).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from accumguard import __version__
from accumguard.cli import main


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    out_dir = tmp_path_factory.mktemp("demo")
    code, out, _ = _run(["demo", "--quick", "--out", str(out_dir)])
    return code, out, out_dir


def test_demo_quick_exit_code_and_verdicts(quick_demo: tuple[int, str, Path]) -> None:
    # Verdicts are read from the JSON report, not from the printed table's columns.
    code, out, out_dir = quick_demo
    assert code == 0, out
    doc = json.loads((out_dir / "demo-report.json").read_text())
    rows = {f"{r['engine']}/{r['loop']}": r for r in doc["rows"]}
    assert all(r["as_expected"] is True for r in rows.values()), out

    def verdict(key: str) -> tuple[str, str, str | None]:
        return rows[key]["expected"], rows[key]["verdict"], rows[key]["diagnosis"]

    assert verdict("ddp/accumulator") == ("pass", "PASS", None)
    assert verdict("ddp/correct")[1] == "PASS"
    assert verdict("ddp/bug-F1") == ("F1", "FAIL", "F1")
    assert verdict("ddp/bug-F5") == ("F5", "FAIL", "F5")
    assert verdict("zero1/accumulator")[1] == "PASS"
    assert verdict("zero1/bug-F3") == ("F3", "FAIL", "F3")
    assert "all verdicts as expected" in out
    assert any("diagnosed F5" in x for x in out.splitlines())
    assert doc["story"] is None  # --quick skips the story part


def test_demo_quick_json_schema(quick_demo: tuple[int, str, Path]) -> None:
    _, _, out_dir = quick_demo
    doc = json.loads((out_dir / "demo-report.json").read_text())
    assert doc["version"] == 1 and doc["accumguard"] == __version__
    assert doc["passed"] is True
    assert doc["setup"]["accumulation_steps"] == 4 and doc["setup"]["world_size"] == 2
    assert doc["setup"]["engines"] == ["ddp", "zero1"]
    fields = {"engine", "loop", "kind", "expected", "verdict", "as_expected",
              "max_update_error", "diagnosis", "collectives_per_step", "optimizer_steps"}
    assert doc["rows"] and all(fields <= set(r) for r in doc["rows"])
    keys = {f"{r['engine']}/{r['loop']}" for r in doc["rows"]}
    assert keys == set(doc["reports"])
    f1 = doc["reports"]["ddp/bug-F1"]
    assert f1["passed"] is False and f1["diagnosis"]["bug_id"] == "F1"
    assert f1["optimizer_steps"] == 8  # 2 windows of K=4, stepped every micro-step
    acc = doc["reports"]["ddp/accumulator"]
    assert acc["passed"] is True and len(acc["losses"]) == 2
    assert (out_dir / "demo-update-error.png").stat().st_size > 1000


def test_no_arguments_prints_help_and_version() -> None:
    code, out, _ = _run([])
    assert code == 0 and "demo" in out and "check-config" in out and "curves" in out
    code, out, _ = _run(["--version"])
    assert code == 0 and __version__ in out


def test_usage_errors_exit_2_with_one_line() -> None:
    code, _, err = _run(["demo", "--engines", "megatron"])
    assert code == 2
    assert err.startswith("accumguard: error:") and "megatron" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = _run(["frobnicate"])
    assert code == 2
    code, _, err = _run(["curves", "--ks", "1,x"])
    assert code == 2 and "--ks" in err
    code, _, err = _run(["curves", "--ks", "3"])  # 3 does not divide the 8 sequences
    assert code == 2 and "divisor" in err


def test_delegated_subcommands(tmp_path: Path) -> None:
    code, out, _ = _run(["audit", "--help"])
    assert code == 0 and "MODULE:SETUP" in out
    # lint: a plain K = 1 loop has no finding (0); the same loop accumulating is AG101 (1)
    script = tmp_path / "train.py"
    script.write_text("for i, b in enumerate(loader):\n    loss = model(b)\n    loss.backward()\n"
                      "    optimizer.step()\n    optimizer.zero_grad()\n")
    code, out, _ = _run(["lint", str(script)])
    assert code == 0, out
    script.write_text("accum_steps = 4\nfor i, b in enumerate(loader):\n    loss = model(b) / accum_steps\n"
                      "    loss.backward()\n    optimizer.step()\n")
    code, out, _ = _run(["lint", str(script)])
    assert code == 1 and "AG101" in out, out
    code, _, err = _run(["lint", str(tmp_path / "missing.py")])
    assert code == 2, err
    # check-config: a missing file is 2; no gradient_clipping is AG203 (1); a complete config is 0
    code, _, err = _run(["check-config", str(tmp_path / "missing.json")])
    assert code == 2
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}')
    code, out, _ = _run(["check-config", str(cfg)])
    assert code == 1 and "AG203" in out, out
    cfg.write_text('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, '
                   '"gradient_clipping": 1.0}')
    code, out, _ = _run(["check-config", str(cfg)])
    assert code == 0, out


def test_curves_overlap(tmp_path: Path) -> None:
    code, out, err = _run(["curves", "--ks", "1,2,8", "--steps", "3", "--out", str(tmp_path),
                           "--no-plot"])
    assert code == 0, err
    assert "curves overlap" in out
    doc = json.loads((tmp_path / "curves.json").read_text())
    assert doc["max_deviation"] < 1e-5
    assert set(doc["losses"]) == {"1", "2", "8"} and len(doc["losses"]["8"]) == 3


def test_bench_passes_options_through() -> None:
    import subprocess
    import sys

    # The benchmark runs in its own process (as `accumguard bench` does): --help is cheap.
    proc = subprocess.run([sys.executable, "-m", "accumguard.cli", "bench", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--rounds" in proc.stdout


def test_watch_prints_a_finding_shared_by_ranks_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The same finding on ranks 0 and 1 (same class, step, evidence) is one block naming
    both ranks; a finding that differs per rank stays one block per rank; JSON untouched."""
    from accumguard.cli.watch import _print
    from accumguard.observe.rules import Finding

    def f(rank: int | None, evidence: str) -> Finding:
        return Finding("F11", "error", rank, 1, 4, evidence, "fix it", "title")

    findings = [f(0, "same text"), f(1, "same text"), f(None, "cross-rank"),
                f(0, "rank 0 number 0.3"), f(1, "rank 1 number 0.4")]
    report = {"ranks": [0, 1], "steps": [], "accumulation_steps": 4,
              "accumulation_steps_source": "flag", "problems": []}
    _print(report, findings)
    err = capsys.readouterr().err
    assert err.count("same text") == 1 and "ranks 0, 1, step 1" in err
    assert "all ranks, step 1" in err
    assert "rank 0 number" in err and "rank 1 number" in err
