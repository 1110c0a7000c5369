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


_BLOCK_TORCH = (
    "import sys\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ImportError('torch is blocked in this test')\n"
    "sys.meta_path.insert(0, _Block())\n")


def test_the_cli_judges_a_recording_without_importing_torch(tmp_path: Path) -> None:
    """The ``watch`` CLI process only starts the command and reads its records: it must not
    import torch (a torch import is 2-3 s of every ``accumguard watch`` start on a quiet
    2-core machine, far more under load; it came in through ``accumguard.engines``' package
    import for a table of names). Judged with torch blocked, the report is the in-process
    one."""
    import subprocess
    import sys

    _train(tmp_path / "rec", zero_every_micro_step=True)
    blocked, here = tmp_path / "blocked.json", tmp_path / "here.json"
    code = (_BLOCK_TORCH + "from accumguard.cli.app import main\n"
            f"sys.exit(main(['watch', '--report', {str(tmp_path / 'rec')!r}, '-k', '4', "
            f"'--json', {str(blocked)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "torch is blocked" not in proc.stderr, proc.stderr[-3000:]
    assert watch_main(["--report", str(tmp_path / "rec"), "-k", "4", "--json", str(here)]) == 1
    got, want = json.loads(blocked.read_text()), json.loads(here.read_text())
    assert got["findings"] == want["findings"] and {f["cls"] for f in got["findings"]} >= {"F3"}
