"""What the data-parallel wrapper rules share: whether a forward runs with gradients on in
training (a loop that runs a backward, a micro-step method, or a function they call), and
whether the file shards with FSDP (whose wrappers differ from DDP's)."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, is_backward
from accumguard.static.lint._context import FileContext

__all__ = ["in_training_loop", "mentions_fsdp", "no_grad", "trains", "under_no_grad"]


def no_grad(node: ast.AST) -> bool:
    """``node`` is ``torch.no_grad()`` / ``inference_mode()`` (as a decorator or context)."""
    text = ast.unparse(node)
    return "no_grad" in text or "inference_mode" in text


def under_no_grad(ctx: FileContext, node: ast.AST, stop: ast.AST) -> bool:
    """``node`` sits in a ``with torch.no_grad():`` block below ``stop``."""
    cur = ctx.parents.get(node)
    while cur is not None and cur is not stop:
        if isinstance(cur, ast.With) and any(no_grad(i.context_expr) for i in cur.items):
            return True
        cur = ctx.parents.get(cur)
    return False


def in_training_loop(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` sits in a loop of its function that runs a backward, with gradients on."""
    loop = ctx.parents.get(node)
    while loop is not None and not isinstance(loop, FUNCS):
        if isinstance(loop, ast.With) and any(no_grad(i.context_expr) for i in loop.items):
            return False
        if isinstance(loop, ast.For | ast.While) and any(
                isinstance(c, ast.Call) and is_backward(c) for c in ast.walk(loop)):
            return True
        loop = ctx.parents.get(loop)
    return False


def mentions_fsdp(ctx: FileContext) -> bool:
    """An identifier or string of the file names FSDP (``fully_shard``, ``strategy="fsdp"``);
    once per file (several rules ask)."""
    return ctx._cached("mentions_fsdp", ctx.tree, lambda: _scan_fsdp(ctx))  # type: ignore[no-any-return]


def _scan_fsdp(ctx: FileContext) -> bool:
    for n in ast.walk(ctx.tree):
        text = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) \
            else n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) \
            else n.name if isinstance(n, ast.alias) else ""
        if "fsdp" in text.lower() or "fully_shard" in text.lower():
            return True
    return False


def trains(ctx: FileContext, node: ast.AST, depth: int = 2) -> bool:
    """``node`` runs with gradients on inside a loop that runs a backward, in a function
    that runs one, or in a function of the file called from those (``depth`` levels)."""
    if in_training_loop(ctx, node):
        return True
    fn = ctx.enclosing(node, FUNCS)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) \
            or any(no_grad(d) for d in fn.decorator_list) or under_no_grad(ctx, node, fn):
        return False
    if any(isinstance(c, ast.Call) and is_backward(c) for c in ctx.local_nodes(fn)):
        return True  # a micro-step method: its forward feeds the backward it runs
    return depth > 0 and any(trains(ctx, site, depth - 1) for site in ctx.call_sites(fn))
