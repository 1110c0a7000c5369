"""The lint corpus: real-world-style scripts with their expected findings as inline markers.

Each ``# expect: AGxxx[, AGyyy]`` marks the exact line of a finding; a script
without markers must be clean. Exact equality catches both misses and false
positives.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accumguard.static.lint import lint_file

CORPUS = Path(__file__).resolve().parents[1] / "lint_corpus"
SCRIPTS = sorted(CORPUS.glob("*.py"))
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9 ,]+)")


def expected(path: Path) -> set[tuple[str, int]]:
    out = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            out.update((code.strip(), lineno) for code in m.group(1).split(",") if code.strip())
    return out


def test_corpus_is_big_and_mixed() -> None:
    assert len(SCRIPTS) >= 20
    correct = [p for p in SCRIPTS if not expected(p)]
    buggy = [p for p in SCRIPTS if expected(p)]
    assert len(correct) >= 10 and len(buggy) >= 10
    # naming convention keeps the corpus readable: ok_* are clean, bug_* have markers
    assert all(p.name.startswith("ok_") for p in correct)
    assert all(p.name.startswith("bug_") for p in buggy)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_corpus_script(script: Path) -> None:
    got = {(f.code, f.line) for f in lint_file(script)}
    assert got == expected(script)


def test_every_script_rule_is_exercised_by_the_corpus() -> None:
    codes = {code for p in SCRIPTS for code, _ in expected(p)}
    assert {f"AG1{n:02d}" for n in range(1, 11)} <= codes
