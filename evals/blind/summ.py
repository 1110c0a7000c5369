"""summ.py DIR...: one line per script of the blind round folders DIR (labels.json, and what
score.sh left), then the round's counts."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def sha(log: Path) -> str | None:
    m = re.findall(r"FINAL_SHA256 ([0-9a-f]{64})", log.read_text(errors="replace")) if log.exists() else []
    return m[-1] if m else None


def main() -> None:
    tally = {"buggy": 0, "watch_hit": 0, "lint_hit": 0, "static": 0, "ok": 0,
             "watch_false": 0, "lint_false": 0, "changed": 0, "runs": 0}
    for d in map(Path, sys.argv[1:]):
        labels = json.loads((d / "labels.json").read_text())
        for name, lab in sorted(labels.items()):
            try:
                w = json.loads((d / f"{name}.watch.json").read_text())
                werr = sorted({f["cls"] for f in w["findings"] if f["severity"] == "error"})
                wwarn = sorted({f["cls"] for f in w["findings"] if f["severity"] == "warning"})
            except (OSError, ValueError, KeyError):
                werr, wwarn = ["?no-report"], []
            try:
                lf = json.loads((d / f"{name}.lint.json").read_text())["findings"]
                lerr = sorted({f"{f['code']}/{f['failure_class']}" for f in lf if f["severity"] == "error"})
                lwarn = sorted({f"{f['code']}/{f['failure_class']}" for f in lf if f["severity"] == "warning"})
            except (OSError, ValueError, KeyError):
                lerr, lwarn = ["?lint"], []
            plain, watched = sha(d / f"{name}.plain.log"), sha(d / f"{name}.watch.log")
            tally["runs"] += 1
            same = plain is not None and plain == watched
            tally["changed"] += not same
            cls = lab.get("class")
            if lab["buggy"]:
                tally["buggy"] += 1
                wh = cls in werr
                lh = any(e.endswith("/" + cls) for e in lerr + lwarn)
                tally["watch_hit"] += wh
                tally["lint_hit"] += lh
                tally["static"] += bool(lab.get("static"))
                mark = f"BUG {cls:10} watch {'HIT ' if wh else 'miss'} lint {'HIT ' if lh else 'miss'}"
            else:
                tally["ok"] += 1
                tally["watch_false"] += bool(werr)
                tally["lint_false"] += bool(lerr)
                mark = f"ok  {'':10} watch {'FALSE' if werr else 'ok   '} lint {'FALSE' if lerr else 'ok   '}"
            print(f"{d.name}/{name:14} {mark} sha {'same' if same else f'DIFF {plain} {watched}'[:30]}"
                  f" | watch err {werr} warn {wwarn} | lint err {lerr} warn {lwarn}")
    print(json.dumps(tally))


if __name__ == "__main__":
    main()
