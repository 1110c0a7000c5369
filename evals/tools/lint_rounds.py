"""lint_rounds.py [OUT.json]: lint every kept blind script (evals/blind/NN/L/*.py) against its
writer's label: per buggy statically-decidable script, is the right class found at error level
or at any severity; per correct script, any error. Writes each script's findings to OUT.json
so a rule change can be diffed against the run before it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from accumguard.static.lint.runner import lint_source

ROOT = Path(__file__).resolve().parents[1] / "blind"


def main() -> None:
    out: dict[str, list[list[str]]] = {}
    tally = {"static_buggy": 0, "at_error": 0, "any": 0, "correct": 0, "false_error": 0}
    for labels_file in sorted(ROOT.glob("*/*/labels.json")):
        labels = json.loads(labels_file.read_text())
        for name, lab in sorted(labels.items()):
            script = labels_file.parent / f"{name}.py"
            if not script.exists():
                continue
            try:
                found = lint_source(script.read_text(), script)
            except Exception as exc:  # a script lint cannot read is counted as silent
                print(f"{script}: {exc}")
                found = []
            rows = [[f.code or "", f.cls, f.severity.value] for f in found]
            key = str(script.relative_to(ROOT))
            out[key] = rows
            errors = {r[1] for r in rows if r[2] == "error"}
            if lab["buggy"]:
                if not lab.get("static"):
                    continue
                tally["static_buggy"] += 1
                tally["at_error"] += lab["class"] in errors
                tally["any"] += lab["class"] in {r[1] for r in rows}
            else:
                tally["correct"] += 1
                if errors:
                    tally["false_error"] += 1
                    print(f"FALSE ERROR {key}: {sorted(errors)}")
    print(json.dumps(tally))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
