"""trim.py SRC DST: copy a kept recording (rank-N.jsonl) for tests/observe/recorded, keeping
the first TRIM_STEPS optimizer steps of each rank (all when unset) and replacing absolute
paths under /work or /tmp by their last part, so a test does not depend on this machine."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

_PATH = re.compile(r"(/work|/tmp)/[^\s:'\"]*/([^/\s:'\"]+)")


def _strip(value: Any) -> Any:
    if isinstance(value, str):
        return _PATH.sub(r"\2", value)
    if isinstance(value, list):
        return [_strip(v) for v in value]
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()}
    return value


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    limit = int(os.environ.get("TRIM_STEPS", "0")) or None
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("rank-*.jsonl")):
        kept, steps = [], 0
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "step":
                steps += 1
                if limit is not None and steps > limit:
                    continue
            elif limit is not None and steps >= limit and rec.get("kind") not in ("end",):
                continue
            kept.append(json.dumps(_strip(rec)))
        (dst / f.name).write_text("\n".join(kept) + "\n")
        print(f"{f.name}: {len(kept)} records")


if __name__ == "__main__":
    main()
