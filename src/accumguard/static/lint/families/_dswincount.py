"""AG134's shape through helpers: a DeepSpeed loop that reads a window of micro-batches ahead,
counts its tokens over the whole window in a function of the file (``n_tokens =
self.global_token_count(window)``) and backwards each micro-batch's loss from a function of
the file that divides a sum by that count (``self.compute_loss(batch, n_tokens)``): the
window's backwards already add up to its mean, and ``engine.backward`` divides by GA again."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument

__all__ = ["helper_window_division"]


def _mentions(node: ast.AST, name: str) -> bool:
    return any(dotted(n) == name for n in walk_all(node) if isinstance(n, ast.Name | ast.Attribute))


def _window_counts(ctx: FileContext, inner: ast.For, window: str) -> set[str]:
    """Names assigned, in the inner loop's function before it starts, from an expression that
    reads the window list (``n_tokens = self.global_token_count(window)``)."""
    fn = ctx.enclosing(inner, FUNCS)
    if fn is None:
        return set()
    return {name for name, values in ctx.assigned_in(fn).items()
            if values and all(getattr(v, "lineno", inner.lineno) < inner.lineno and _mentions(v, window)
                              and not isinstance(v, ast.ListComp | ast.List) for v in values)}


def _divides_by(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and dotted(n.right) == name
               for n in walk_all(expr))


def _sums(fn: ast.AST) -> bool:
    """A sum is computed in ``fn``: ``reduction="sum"`` or ``.sum()``."""
    return any((isinstance(n, ast.keyword) and n.arg == "reduction" and isinstance(n.value, ast.Constant)
                and n.value.value == "sum") or (isinstance(n, ast.Call) and call_attr(n) == "sum")
               for n in walk_all(fn))


def _names_k(ctx: FileContext, expr: ast.AST) -> bool:
    """Something in ``expr`` names K or is sized by it (``engine_divisor = gas * world``)."""
    return any(ctx.mentions_accum(n) or ctx.sized_by_accum(n) for n in walk_all(expr)
               if isinstance(n, ast.Name | ast.Attribute))


def _normalised_by(ctx: FileContext, value: ast.AST, counts: set[str]) -> tuple[str, ast.AST] | None:
    """(count, the function dividing by it) when ``value`` calls a function of the file,
    handing it one of ``counts``, that returns a sum divided by it; None when K is named in
    ``value`` or those returns. (A division written in the loop itself is AG134's own.)"""
    if _names_k(ctx, value):
        return None
    for call in (n for n in walk_all(value) if isinstance(n, ast.Call)):
        fn = ctx.callee_of(call)
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for param in (a.arg for a in fn.args.args):
            arg = bound_argument(fn, call, param)
            if arg is not None and dotted(arg) in counts:
                rets = [r.value for r in walk_all(fn) if isinstance(r, ast.Return) and r.value is not None]
                if rets and all(_divides_by(r, param) for r in rets) and _sums(fn) \
                        and not any(_names_k(ctx, r) for r in rets):
                    return dotted(arg) or "", fn
    return None


def helper_window_division(ctx: FileContext, backward: ast.Call) -> tuple[str, str, ast.AST] | None:
    """(the window list, the count, the function dividing by it) when ``backward``'s loss is
    normalised over the whole window read ahead, with no K in sight; None otherwise."""
    inner = ctx.enclosing(backward, (ast.For, ast.AsyncFor, ast.While))
    if not isinstance(inner, ast.For) or (window := dotted(inner.iter)) is None or not backward.args:
        return None
    counts = _window_counts(ctx, inner, window)
    if not counts:
        return None
    loss = backward.args[0]
    values: list[ast.AST] = [loss]
    if isinstance(loss, ast.Name):
        values = list(ctx.assigned_in(inner).get(loss.id, [])) or list(
            ctx.assigned_in(ctx.enclosing(inner, FUNCS) or ctx.tree).get(loss.id, []))
    hits = [h for v in values if (h := _normalised_by(ctx, v, counts)) is not None]
    if not values or len(hits) != len(values):
        return None
    return window, hits[0][0], hits[0][1]
