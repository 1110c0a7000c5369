"""Static checks: ``accumguard lint`` (training scripts, by AST) and ``accumguard
check-config`` (DeepSpeed configs, read with hjson as DeepSpeed reads them).

Stdlib (+ hjson) only, on top of :mod:`accumguard.core`: it never imports torch,
so it runs in a CI job that has no torch installed.
"""

from accumguard.static.findings import RULES, Confidence, Finding, Rule, Severity

__all__ = ["RULES", "Confidence", "Finding", "Rule", "Severity"]
