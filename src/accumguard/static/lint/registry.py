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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from accumguard.static.findings import RULES, Finding, rule_matches
from accumguard.static.lint._context import FileContext

__all__ = ["Check", "all_checks", "rule", "run_checks", "selected_checks"]

CheckFn = Callable[[FileContext], Iterable[Finding]]


@dataclass(frozen=True)
class Check:
    """One registered rule: the codes it may emit, its family, and the function."""

    codes: tuple[str, ...]
    family: str
    fn: CheckFn

    @property
    def name(self) -> str:
        return self.fn.__name__


_CHECKS: list[Check] = []


def rule(*codes: str) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check for ``codes`` (each must be in the catalogue)."""

    def register(fn: CheckFn) -> CheckFn:
        unknown = [c for c in codes if c not in RULES]
        if unknown:
            raise ValueError(f"rule {fn.__name__} emits {unknown}, which are not in findings.RULES")
        _CHECKS.append(Check(tuple(codes), fn.__module__.rsplit(".", 1)[-1], fn))
        return fn

    return register


def all_checks() -> list[Check]:
    """Every registered check (importing the families registers them)."""
    import accumguard.static.lint.families  # noqa: F401  (registers the rules)

    return list(_CHECKS)


def _wanted(code: str, select: Sequence[str] | None, ignore: Sequence[str] | None) -> bool:
    if select and not rule_matches(code, list(select)):
        return False
    return not (ignore and rule_matches(code, list(ignore)))


def selected_checks(select: Sequence[str] | None = None, ignore: Sequence[str] | None = None) -> list[Check]:
    """The checks that can emit at least one code kept by ``select``/``ignore``."""
    return [c for c in all_checks() if any(_wanted(code, select, ignore) for code in c.codes)]


def run_checks(
    ctx: FileContext, select: Sequence[str] | None = None, ignore: Sequence[str] | None = None
) -> list[Finding]:
    """Run the selected checks on one file; keep only selected codes."""
    out: list[Finding] = []
    for check in selected_checks(select, ignore):
        out.extend(f for f in check.fn(ctx) if _wanted(f.code, select, ignore))
    return out
