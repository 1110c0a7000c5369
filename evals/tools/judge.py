"""judge.py DIR [K]: watch's rules on a recording kept with ``accumguard watch --keep DIR``,
offline (no run). Prints each finding's class, severity, rank, step and evidence."""
from __future__ import annotations

import sys
from pathlib import Path

from accumguard.observe._records import load_recordings
from accumguard.observe.rules import analyze


def main() -> None:
    rec = load_recordings(Path(sys.argv[1]))
    k = int(sys.argv[2]) if len(sys.argv) > 2 else None
    findings, k_seen, k_source = analyze(rec, k_flag=k)
    print(f"K = {k_seen} ({k_source}); judge failures: {len(rec.judge_failures)}")
    for f in findings:
        print(f"{f.severity.value:7} {f.cls:10} rank {f.rank} step {f.step} micro {f.micro}: {f.title}")
        print(f"        {f.evidence}")
    for fail in rec.judge_failures:
        print("JUDGE FAILURE", fail)


if __name__ == "__main__":
    main()
