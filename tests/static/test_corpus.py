"""The lint corpus: real-world-style scripts with their expected findings as inline markers.

Every script starts with ``# corpus: style=<style> class=<F.. or OK> [miss=<why>]``
and marks each expected finding with ``# expect: AGxxx[, AGyyy]`` on its line. Exact
equality of (code, line) catches both misses and false alarms; the aggregate tests
hold the bar of issue 11: no error on a correct script, >= 80 % of buggy scripts
flagged with the right failure class, every undetected bug declared with its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accumguard.static import Severity
from accumguard.static.lint import lint_file

CORPUS = Path(__file__).resolve().parents[1] / "lint_corpus"
SCRIPTS = sorted(CORPUS.glob("*.py"))
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9 ,]+)")
_HEADER = re.compile(r"^# corpus: style=(?P<style>[a-z0-9_]+) class=(?P<cls>[A-Za-z0-9/_]+)(?: miss=(?P<miss>.+))?$")


def header(path: Path) -> tuple[str, str, str | None]:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    m = _HEADER.match(first)
    assert m, f"{path.name}: first line must be '# corpus: style=... class=...'"
    return m["style"], m["cls"], m["miss"]


def expected(path: Path) -> set[tuple[str, int]]:
    out = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            out.update((code.strip(), lineno) for code in m.group(1).split(",") if code.strip())
    return out


def right_class(found: str, truth: str) -> bool:
    """F1 names F1b too (step every micro-step, zero_grad gated or not)."""
    return bool(found) and (found == truth or truth.startswith(found))


_RESULTS = {p: lint_file(p) for p in SCRIPTS}
BUGGY = [p for p in SCRIPTS if header(p)[1] != "OK"]
CORRECT = [p for p in SCRIPTS if header(p)[1] == "OK"]


def test_corpus_is_big_and_varied() -> None:
    styles = {header(p)[0] for p in SCRIPTS}
    assert len(SCRIPTS) >= 60 and len(styles) >= 15, (len(SCRIPTS), sorted(styles))
    assert len(CORRECT) >= 25 and len(BUGGY) >= 25
    # naming convention keeps the corpus readable: ok_* are correct, bug_* are buggy
    assert all(p.name.startswith("ok_") for p in CORRECT)
    assert all(p.name.startswith("bug_") for p in BUGGY)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_corpus_script(script: Path) -> None:
    got = {(f.code, f.line) for f in _RESULTS[script]}
    assert got == expected(script)


def test_no_error_on_a_correct_script() -> None:
    errors = [(p.name, f.code, f.line) for p in CORRECT for f in _RESULTS[p] if f.severity is Severity.ERROR]
    assert errors == []


def test_buggy_scripts_flagged_with_the_right_class() -> None:
    flagged = [
        p for p in BUGGY if any(right_class(f.failure_class, header(p)[1]) for f in _RESULTS[p])
    ]
    rate = len(flagged) / len(BUGGY)
    print(f"\nlint corpus: {len(flagged)}/{len(BUGGY)} buggy scripts flagged with the right class "
          f"({rate:.0%}); {len(CORRECT)} correct scripts, 0 errors on them")
    assert rate >= 0.80


def test_every_miss_is_declared_and_every_declared_miss_is_real() -> None:
    for p in BUGGY:
        _, cls, miss = header(p)
        hit = any(right_class(f.failure_class, cls) for f in _RESULTS[p])
        assert hit != bool(miss), f"{p.name}: flagged={hit} but miss={miss!r}"


def test_every_script_rule_is_exercised_by_the_corpus() -> None:
    codes = {code for p in SCRIPTS for code, _ in expected(p)}
    assert {f"AG1{n:02d}" for n in range(1, 19)} <= codes
