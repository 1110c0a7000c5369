"""Accelerate rules: what ``accelerator.backward`` already does to the loss.

AG121 the loss is divided by the number of accumulation steps before
      ``accelerator.backward(loss)`` while the ``Accelerator`` was built with
      ``gradient_accumulation_steps`` = K > 1: ``backward`` divides by K itself (outside
      DeepSpeed, whose engine divides instead), so the loss is divided twice and the
      gradient is G / K.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._modguard import k_values
from accumguard.static.lint.families.loss import _assigned_names, _division, _is_loss_division

__all__ = ["loss_divided_before_accelerator_backward"]


def _accelerator_ks(ctx: FileContext) -> set[int | None]:
    """The ``gradient_accumulation_steps`` values given to ``Accelerator(...)`` in the file."""
    values: set[int | None] = set()
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").split(".")[-1] == "Accelerator":
            for kw in call.keywords:
                if kw.arg == "gradient_accumulation_steps":
                    values |= k_values(ctx, kw.value, call)
    return values


def _accelerator_backwards(ctx: FileContext, scope: ast.AST) -> list[tuple[ast.Call, set[str]]]:
    """``accelerator.backward(loss)`` calls in ``scope`` with the names their loss is made of."""
    return [(call, names) for call, names in ctx.backward_losses(scope)
            if call_attr(call) == "backward" and call.args
            and "accelerator" in (dotted(receiver(call)) or "").lower()]


def _k_only_below(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """K divides the divisor (``loss / (n / K)`` multiplies by K, undoing ``backward``'s own
    division), or this division is the divisor of another one."""
    parent = ctx.parents.get(node)
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and parent.right is node:
        return True
    inner = _division(divisor)
    return inner is not None and ctx.mentions_accum(inner[1]) and not ctx.mentions_accum(inner[0])


@rule("AG121")
def loss_divided_before_accelerator_backward(ctx: FileContext) -> Iterator[Finding]:
    ks = _accelerator_ks(ctx)
    if not ks or not all(k is not None and k > 1 for k in ks):
        return
    for node in ctx.of(ast.BinOp, ast.AugAssign):
        d = _division(node)
        if d is None:
            continue
        divisor = d[1]
        if not (ctx.mentions_accum(divisor) or ctx.int_value(divisor) in ks):
            continue
        if not _is_loss_division(ctx, node, d[0]) or _k_only_below(ctx, node, divisor):
            continue
        scope = ctx.scope_of(node)
        backs = _accelerator_backwards(ctx, scope)
        if not backs:
            continue
        inside = any(node in set(walk_all(call.args[0])) for call, _ in backs)
        names = _assigned_names(ctx, node)
        line = getattr(node, "lineno", 0)
        later = any(call.lineno >= line and names & src for call, src in backs)
        if not (inside or later):
            continue
        yield ctx.finding(
            "AG121",
            node,
            f"the loss is divided by the accumulation steps (`{ast.unparse(node)}`) before "
            "`accelerator.backward()`, which divides by the Accelerator's "
            "gradient_accumulation_steps itself: the loss is divided twice, and the optimizer "
            "receives G / K",
        )
