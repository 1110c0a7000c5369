"""Gradient-sync calls in the wrong place among their statements (F11): AG106 for FSDP2's
``set_requires_gradient_sync`` called after the micro-step's backward (it decides the next
backward's sync), and AG111 for one ``with`` entering ``a.no_sync()`` unconditionally beside
an item chosen by a condition (the conditional expression binds to the last item only). A
flag's polarity is read as :mod:`.sync` reads it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    call_attr,
    dotted,
    has_backward,
    is_backward,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.sync import _effective

__all__ = ["fsdp_sync_flag_after_backward", "no_sync_beside_a_conditional_one"]


def _block_of(ctx: FileContext, stmt: ast.AST) -> tuple[list[ast.stmt], int] | None:
    """The statement list holding ``stmt`` and its index there."""
    parent = ctx.parents.get(stmt)
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list):
            for i, s in enumerate(block):
                if s is stmt:
                    return block, i
    return None


@rule("AG106")
def fsdp_sync_flag_after_backward(ctx: FileContext) -> Iterator[Finding]:
    """AG106 for FSDP2: ``set_requires_gradient_sync(<on at the window's last micro-step>)``
    as a statement after that micro-step's backward (a backward earlier in the same block,
    none after it). FSDP2 reads the flag when a backward runs, so this value decides the
    next micro-step's backward: the window's last backward runs with the previous
    micro-step's value, off, and its gradient is never reduce-scattered."""
    for call in ctx.of(ast.Call):
        if call_attr(call) != "set_requires_gradient_sync" or not call.args \
                or not isinstance(call.func, ast.Attribute):
            continue
        stmt = ctx.parents.get(call)
        if not isinstance(stmt, ast.Expr):
            continue
        where = _block_of(ctx, stmt)
        if where is None:
            continue
        block, i = where
        if not has_backward(block[:i]) or has_backward(block[i + 1:]):
            continue
        if _effective(ctx, stmt, call.args[0]) != "boundary":
            continue
        recv = dotted(receiver(call)) or "model"
        yield ctx.finding(
            "AG106", stmt,
            f"`{recv}.set_requires_gradient_sync({ast.unparse(call.args[0])})` comes after this "
            "micro-step's backward: FSDP2 reads the flag when a backward runs, so it decides the "
            "next micro-step's. The window's last backward runs with the value set after the "
            "one before it (off): the window's gradient is never reduce-scattered and the "
            "ranks' shards drift apart",
            fix="call set_requires_gradient_sync(is_last_micro_step) before the micro-step's "
                "forward and backward")


def _no_sync_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and call_attr(expr) == "no_sync"


@rule("AG111")
def no_sync_beside_a_conditional_one(ctx: FileContext) -> Iterator[Finding]:
    """AG111: one ``with`` entering ``a.no_sync()`` unconditionally beside an item chosen by a
    condition (``with actor.no_sync(), critic.no_sync() if not sync else nullcontext():``: the
    conditional expression binds to the last item only). The unconditional one is entered on
    every micro-step, the window's last included: that module never synchronises."""
    for node in ctx.of(ast.With, ast.AsyncWith):
        if not isinstance(node, ast.With | ast.AsyncWith) or len(node.items) < 2:
            continue
        exprs = [item.context_expr for item in node.items]
        gated = [e for e in exprs if isinstance(e, ast.IfExp)
                 and (_no_sync_call(e.body) or _no_sync_call(e.orelse))]
        plain = [e for e in exprs if _no_sync_call(e)]
        if not gated or not plain or not any(is_backward(c) for s in node.body
                                             for c in walk_all(s) if isinstance(c, ast.Call)):
            continue
        first = plain[0]
        recv = (dotted(receiver(first)) if isinstance(first, ast.Call) else None) or "model"
        yield ctx.finding(
            "AG111", node,
            f"`{ast.unparse(plain[0])}` is entered on every micro-step: in `with "
            f"{', '.join(ast.unparse(e) for e in exprs)}:` the condition applies to "
            f"`{ast.unparse(gated[0].body if _no_sync_call(gated[0].body) else gated[0].orelse)}` "
            f"only, so `{recv}`'s gradients are never synchronised, not even at the window's "
            "last micro-step, and its ranks drift apart",
            fix="choose every context by the condition: `contextlib.ExitStack()` entering each "
                "no_sync() when not at the last micro-step, or `(a.no_sync() if not sync else "
                "nullcontext())` for each module")
