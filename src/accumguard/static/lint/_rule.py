"""The rule table and the ``@rule`` decorator the families register with.

Kept apart from :mod:`.registry` (which imports the families to fill the table) so
that a family module imports only this one: no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from accumguard.static.findings import RULES, Finding
from accumguard.static.lint._context import FileContext

__all__ = ["CHECKS", "Check", "CheckFn", "rule"]

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


CHECKS: list[Check] = []


def rule(*codes: str) -> Callable[[CheckFn], CheckFn]:
    """Register ``fn`` as the check for ``codes`` (each must be in the catalogue)."""

    def register(fn: CheckFn) -> CheckFn:
        unknown = [c for c in codes if c not in RULES]
        if unknown:
            raise ValueError(f"rule {fn.__name__} emits {unknown}, which are not in findings.RULES")
        CHECKS.append(Check(tuple(codes), fn.__module__.rsplit(".", 1)[-1], fn))
        return fn

    return register
