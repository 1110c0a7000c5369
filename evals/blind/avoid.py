"""Regenerate AVOID.md: the scenarios of rounds >= FIRST, read from docs/dev/blind-rounds.md.

Usage: python evals/blind/avoid.py [FIRST]   (default 70; writes evals/blind/AVOID.md)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOURNAL = HERE.parents[1] / "docs" / "dev" / "blind-rounds.md"
HEAD = (
    "# Scenarios earlier rounds used (do not repeat these exact scenarios; the same bug class "
    "in a new setting or a new spelling is fine)\n"
)


def scenarios(text: str, first: int) -> list[str]:
    out = []
    for block in re.split(r"^## Round ", text, flags=re.M)[1:]:
        number = int(block.split(" ", 1)[0])
        if number < first:
            continue
        body = " ".join(block.split("\n\n", 1)[1].split("\n\n")[0:2]).replace("\n", " ")
        at = body.find("(a_)")  # "Frameworks (a_):", "Hand loops (a_):", ...
        if at < 0:
            continue
        start = body.rfind(". ", 0, at) + 2
        scenario = body[start:].split(" Scored on")[0].split("\n|")[0].rstrip(" :")
        out.append(f"- Round {number}: {scenario}")
    return out


if __name__ == "__main__":
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 70
    lines = scenarios(JOURNAL.read_text(), first)
    (HERE / "AVOID.md").write_text(HEAD + "\n" + "\n\n".join(lines) + "\n")
    print(f"{len(lines)} rounds written to {HERE / 'AVOID.md'}")
