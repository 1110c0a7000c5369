"""The rule registry: each lint rule is a small function registered with the codes it emits.

A rule family is one module of :mod:`accumguard.static.lint.families` (window,
schedule, loss, sync, reduce, deepspeed); each of its rules is a function
``check(ctx: FileContext) -> Iterable[Finding]`` decorated with
``@rule("AG101")``. ``--select``/``--ignore`` are applied *before* anything
runs: :func:`selected_checks` returns only the rules that can emit a selected
code, so an unselected rule costs nothing. To add a rule: add its code to
:data:`accumguard.static.findings.RULES` (the catalogue, documented in
docs/rules.md), then write the function in the family module it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence

from accumguard.static.findings import Finding, rule_matches
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import CHECKS, Check, rule

__all__ = ["Check", "all_checks", "rule", "run_checks", "selected_checks"]


def all_checks() -> list[Check]:
    """Every registered check (importing the families registers them)."""
    import accumguard.static.lint.families  # noqa: F401  (registers the rules)

    return list(CHECKS)


def _wanted(code: str, select: Sequence[str] | None, ignore: Sequence[str] | None) -> bool:
    if select and not rule_matches(code, list(select)):
        return False
    return not (ignore and rule_matches(code, list(ignore)))


def selected_checks(select: Sequence[str] | None = None, ignore: Sequence[str] | None = None) -> list[Check]:
    """The checks that can emit at least one code kept by ``select``/``ignore``."""
    return [c for c in all_checks() if any(_wanted(code, select, ignore) for code in c.codes)]


def run_checks(
    ctx: FileContext, select: Sequence[str] | None = None, ignore: Sequence[str] | None = None,
    failures: list[str] | None = None,
) -> list[Finding]:
    """Run the selected checks on one file; keep only selected codes. A check that raises
    (a bug of accumguard's on a script it has never seen) loses its own findings only: the
    others still run, and ``failures`` (when given) gets one line naming the check, its
    codes and the error; without ``failures`` the error propagates."""
    out: list[Finding] = []
    for check in selected_checks(select, ignore):
        try:
            found = [f for f in check.fn(ctx) if _wanted(f.code or "", select, ignore)]
        except RecursionError:
            raise
        except Exception as exc:
            if failures is None:
                raise
            failures.append(f"accumguard's rule {check.name} ({', '.join(check.codes)}) failed "
                            f"on this file: {type(exc).__name__}: {exc}; its findings are "
                            "missing, the other rules ran (a bug of accumguard's: please report "
                            "it with the script)")
            continue
        out.extend(found)
    return out
