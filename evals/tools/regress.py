"""regress.py OUT.json SCRIPT.py...: run kept blind scripts under ``accumguard watch`` (each in
a scratch copy of its folder, with its own .cmd) and write each run's findings (class,
severity) to OUT.json; prints the scripts whose error classes differ from their label (a
correct script with an error, a buggy one without its class)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run(script: Path) -> list[dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="agregr-") as tmp:
        work = Path(tmp) / script.parent.name
        shutil.copytree(script.parent, work, ignore=shutil.ignore_patterns("*.log", "*.json.out"))
        cmd = (work / f"{script.stem}.cmd").read_text().split()
        report = work / "report.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
        subprocess.run([sys.executable, "-m", "accumguard.cli", "watch", "--json", str(report),
                        "--", *cmd], cwd=work, env=env, timeout=900,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        if not report.exists():
            return [{"cls": "?no-report", "severity": "error"}]
        return [{"cls": f["cls"], "severity": f["severity"]}
                for f in json.loads(report.read_text())["findings"]]


def main() -> None:
    out: dict[str, list[dict[str, str]]] = {}
    for arg in sys.argv[2:]:
        script = Path(arg).resolve()
        labels = json.loads((script.parent / "labels.json").read_text())
        lab = labels[script.stem]
        found = run(script)
        out[str(script)] = found
        errors = sorted({f["cls"] for f in found if f["severity"] == "error"})
        want = lab["class"] if lab["buggy"] else None
        ok = (want in errors) if want else not errors
        print(f"{'ok  ' if ok else 'DIFF'} {script.parent.parent.name}/{script.stem}: "
              f"errors {errors} (label {want})", flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
