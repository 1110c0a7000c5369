"""Rewrite imports of moved accumguard module paths to their new homes, in place.

    python scripts/rewrite_moved_imports.py FILE_OR_DIR ...   # then: ruff check --fix --select I

The table is ``accumguard._moved.MOVED`` (the one place that knows the old layout), so
glue code and branches written against an old path (``accumguard.runtime.watch``,
``accumguard.verify.invariance``, ...) are brought to the new one without reading each
DeprecationWarning. Dotted paths are rewritten wherever they appear (imports, docstrings,
strings given to ``python -c``); ``from PARENT import LEAF`` of a moved module becomes
``from NEW_PARENT import NEW_LEAF as LEAF`` when it names that one module, and is printed
for a hand edit when it names several. The old top-level modules (``accumguard.audit``,
``accumguard.guard``, ...) share their names with top-level functions: only ``from OLD
import ...`` is rewritten for them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from accumguard._moved import MOVED


def _one(text: str, old: str, new: str) -> tuple[str, list[str]]:
    parent, leaf = old.rsplit(".", 1)
    new_parent, new_leaf = new.rsplit(".", 1)
    if parent == "accumguard":
        # accumguard.audit, .guard ... are also top-level functions: only ``from OLD import``
        # and ``from OLD.sub import`` are surely the module
        return re.sub(rf"^(\s*from ){re.escape(old)}([. ])", rf"\g<1>{new}\g<2>", text,
                      flags=re.MULTILINE), []

    def single(m: re.Match[str]) -> str:
        alias = m.group(2) or (f" as {leaf}" if new_leaf != leaf else "")
        return f"{m.group(1)}from {new_parent} import {new_leaf}{alias}"

    text = re.sub(rf"^(\s*)from {re.escape(parent)} import {leaf}(\s+as\s+\w+)?[ \t]*$",
                  single, text, flags=re.MULTILINE)
    text = re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, text)
    several = re.compile(rf"^\s*from {re.escape(parent)} import .*\b{leaf}\b.*$", re.MULTILINE)
    return text, [m.group(0).strip() for m in several.finditer(text)]


def rewrite(text: str) -> tuple[str, list[str]]:
    """The text with every moved path replaced, and the lines left for a hand edit."""
    manual: list[str] = []
    for old in sorted(MOVED, key=len, reverse=True):  # longest first: watch_report, watch
        text, left = _one(text, old, MOVED[old])
        manual += left
    return text, manual


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    files = [f for a in map(Path, argv) for f in ([a] if a.is_file() else sorted(a.rglob("*.py")))]
    for path in files:
        old = path.read_text(encoding="utf-8")
        new, manual = rewrite(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {path}")
        for line in manual:
            print(f"{path}: edit by hand (several names, one moved): {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
