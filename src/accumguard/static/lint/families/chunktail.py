"""Windows cut by a chunking helper, each loss divided by K (F7): AG307.

``for window in chunked(loader, K):`` (a helper of the file that yields ``list(islice(it,
K))``, ``itertools.batched``, ``more_itertools.chunked``) makes windows of K micro-batches
and, when the pass's length is not a multiple of K, a last window of fewer. A loss divided by
that same K in the window's micro-steps (inline or in a function they call) weighs the short
window's micro-batches as one of K: its gradient is r/K of its mean, while the full windows'
are not shrunk. Right: divide by the window's own length (``len(window)``) or count. A
warning: whether a pass leaves a short window depends on lengths the file may not show.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted, is_backward
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_CHUNKERS = frozenset({"batched", "chunked", "ichunked"})


def _chunker(ctx: FileContext, call: ast.Call) -> bool:
    """``call`` runs a chunking helper: itertools/more_itertools', or a generator of the
    file that yields ``islice`` chunks."""
    name = (dotted(call.func) or "").rsplit(".", 1)[-1]
    fn = ctx.callee_of(call)
    if fn is None:
        return name in _CHUNKERS
    names = {n.id if isinstance(n, ast.Name) else n.attr
             for n in ast.walk(fn) if isinstance(n, ast.Name | ast.Attribute)}
    return "islice" in names and any(isinstance(n, ast.Yield) for n in ast.walk(fn))


def _reached(ctx: FileContext, node: ast.AST, depth: int = 3) -> list[ast.AST]:
    """``node`` and the file's functions its calls run, ``depth`` levels down."""
    out, todo, seen = [node], [(node, depth)], {id(node)}
    while todo:
        cur, d = todo.pop()
        if d == 0:
            continue
        for n in ast.walk(cur):
            if isinstance(n, ast.Call) and (fn := ctx.callee_of(n)) is not None \
                    and id(fn) not in seen:
                seen.add(id(fn))
                out.append(fn)
                todo.append((fn, d - 1))
    return out


@rule("AG307")
def chunked_window_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)
                and len(loop.iter.args) >= 2 and _chunker(ctx, loop.iter)):
            continue
        k = dotted(loop.iter.args[1])
        if k is None:
            continue
        places = [n for p in _reached(ctx, ast.Module(body=loop.body, type_ignores=[]))
                  for n in ast.walk(p)]
        if not any(isinstance(n, ast.Call) and is_backward(n) for n in places):
            continue
        div = next((n for n in places if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                    and dotted(n.right) == k), None)
        if div is None:
            continue
        yield ctx.finding(
            "AG307", div,
            f"`{ast.unparse(div)}` divides every micro-step's loss by `{k}`, the chunk size of "
            f"`{ast.unparse(loop.iter)}` (line {loop.lineno}): a pass whose length is not a "
            f"multiple of it ends in a shorter chunk, whose micro-batches then weigh as "
            f"one of `{k}` (the short window's gradient shrunk by its length over `{k}`)")
