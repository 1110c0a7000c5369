"""Static checks for gradient-accumulation bugs: ``accumguard lint`` and ``accumguard check-config``.

The package is stdlib-only (it parses scripts with :mod:`ast` and never
imports them), so it runs in CI without torch or DeepSpeed installed.
"""

from __future__ import annotations

from accumguard.lint.catalog import RULES, Confidence, Finding, Rule, Severity

__all__ = ["RULES", "Confidence", "Finding", "Rule", "Severity", "lint_paths", "lint_source"]


def __getattr__(name: str) -> object:
    # Lazy: accumguard.dsconfig imports accumguard.lint.catalog, and the rules import dsconfig.
    if name in ("lint_paths", "lint_source"):
        from accumguard.lint import rules

        return getattr(rules, name)
    raise AttributeError(f"module 'accumguard.lint' has no attribute {name!r}")
