"""The ``watch --json`` report has the documented, versioned layout (docs/watch.md, "JSON
report"), built in-process from a real recording (no launch): ``watch --report DIR``
judges a directory of rank records exactly as ``watch`` does after its command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from accumguard.cli.watch import JSON_SCHEMA_VERSION, watch_main
from accumguard.watch._recording import recording

DOC = Path(__file__).resolve().parents[2] / "docs" / "watch.md"


def _train(out: Path, *, zero_every_micro_step: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(out):
        for i in range(8):
            if zero_every_micro_step:
                opt.zero_grad()  # F3: only the last micro-batch reaches the step
            x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))
            (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()


def _documented_fields() -> set[str]:
    text = DOC.read_text(encoding="utf-8").split("## JSON report", 1)[1].split("\n## ", 1)[0]
    return {f for row in re.findall(r"^\| (.+?) \|", text, flags=re.M)
            for f in re.findall(r"`(\w+)`", row)}


def test_the_json_report_has_exactly_the_documented_fields(tmp_path: Path) -> None:
    _train(tmp_path / "rec", zero_every_micro_step=False)
    out = tmp_path / "r.json"
    assert watch_main(["--report", str(tmp_path / "rec"), "-k", "4", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == JSON_SCHEMA_VERSION == 1
    assert set(doc) == _documented_fields(), set(doc) ^ _documented_fields()
    assert doc["checked"] is True and doc["findings"] == [] and doc["ranks"] == [0]
    assert [s["step"] for s in doc["steps"]] == [1, 2]


def test_a_finding_in_the_json_report_has_its_documented_keys(tmp_path: Path) -> None:
    _train(tmp_path / "rec", zero_every_micro_step=True)
    out = tmp_path / "r.json"
    assert watch_main(["--report", str(tmp_path / "rec"), "-k", "4", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    f3 = [f for f in doc["findings"] if f["cls"] == "F3"]
    assert f3 and f3[0]["severity"] == "error"
    assert set(f3[0]) == {"cls", "severity", "rank", "step", "micro", "evidence", "fix", "title"}


def test_the_python_api_runs_a_command_and_returns_the_same_report(tmp_path: Path) -> None:
    """``accumguard.watch([...])``: the library entry point the CLI is built on."""
    import sys

    import accumguard

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n"
        "    opt.zero_grad()  # every micro-step: F3\n"
        "    x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))\n"
        "    (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()\n"
        "    if (i + 1) % 4 == 0:\n"
        "        opt.step()\n")
    result = accumguard.watch([sys.executable, str(script)], accumulation_steps=4,
                              keep=tmp_path / "rec")
    assert result.checked and result.exit_code == 1
    assert {f.cls for f in result.errors} == {"F3"}
    assert result.report["schema_version"] == 1 and result.report["ranks"] == [0]
    assert (tmp_path / "rec" / "rank-0.jsonl").exists()
