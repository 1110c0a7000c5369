"""Accelerate's ``accumulate()`` over a DataLoader that ``accelerator.prepare`` never saw
(F7): AG161.

``with accelerator.accumulate(model):`` decides the boundary from a count of micro-steps and
from the end of a pass over a DataLoader the Accelerator prepared (``sync_with_dataloader``,
the default): at a pass's end it steps on the short last window. Iterating a plain
``DataLoader`` instead, Accelerate never sees the pass end: when a pass's length is not a
multiple of K its last micro-batches are carried into the next pass's first window (and the
run's last partial window is never stepped). A warning: whether the pass's length is a
multiple of K is not in sight. Silent when the plugin turns ``sync_with_dataloader`` off.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import iterated
from accumguard.static.lint.families.accelerate import accelerator_ks

__all__ = ["accumulate_over_unprepared_loader"]


def _prepared(ctx: FileContext) -> set[str]:
    """Names handed to or returned by ``accelerator.prepare(...)``."""
    out: set[str] = set()
    for node in ctx.of(ast.Assign):
        if isinstance(node.value, ast.Call) and call_attr(node.value) in ("prepare", "prepare_data_loader"):
            out.update(d for t in node.targets for x in walk_all(t) if (d := dotted(x)))
    for call in ctx.of(ast.Call):
        if call_attr(call) in ("prepare", "prepare_data_loader"):
            out.update(d for a in call.args if (d := dotted(a)))
    return out


def _no_dataloader_sync(ctx: FileContext) -> bool:
    return any(kw.arg == "sync_with_dataloader" and not (
        isinstance(kw.value, ast.Constant) and kw.value.value is True)
        for call in ctx.of(ast.Call) for kw in call.keywords)


@rule("AG161")
def accumulate_over_unprepared_loader(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    if not ks or not all(k is None or k > 1 for k in ks) or _no_dataloader_sync(ctx):
        return
    prepared = _prepared(ctx)
    for node in ctx.of(ast.With):
        if not any(isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
                   for i in node.items):
            continue
        loop = ctx.enclosing(node, (ast.For, ast.AsyncFor))
        if not isinstance(loop, ast.For | ast.AsyncFor):
            continue
        name = iterated(loop)
        values = ctx.values_by_name().get(name or "", [])
        if name is None or name in prepared or len(values) != 1 or not (
                isinstance(values[0], ast.Call)
                and (dotted(values[0].func) or "").rsplit(".", 1)[-1] == "DataLoader"):
            continue
        f = ctx.finding(
            "AG161",
            loop,
            f"`accelerator.accumulate()` runs over `{name}`, a DataLoader that "
            "`accelerator.prepare` never wrapped: Accelerate closes a window at the end of a "
            "pass only over a DataLoader it prepared, so when a pass's length is not a "
            "multiple of K its last micro-batches are carried into the next pass's first "
            "window (and the run's last partial window is never stepped)",
        )
        yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
