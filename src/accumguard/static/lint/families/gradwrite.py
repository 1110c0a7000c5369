"""AG167 (F3): ``.grad`` overwritten on every micro-step of a window, where nothing else
accumulates it.

A loop that computes its gradients with ``torch.autograd.grad`` (to log or combine per-task
gradients, PCGrad-style) and writes them back with ``p.grad = g`` replaces what the earlier
micro-steps of the window left in ``.grad``: when the optimizer steps after the loop over the
window's micro-batches, only the last micro-batch's gradient reaches it. Reported when the
assignment's value never reads ``.grad`` (``p.grad = g if p.grad is None else p.grad + g``
accumulates and is right), no ``.backward()`` runs in the same function (a backward adds to
``.grad``; the assignment then belongs to another pattern), the assignment runs on every
call of a function that a loop over micro-batches calls (or in that loop itself), and an
optimizer steps after that loop, outside it (directly or in a helper of the file the code
after the loop calls: ``self.sync_and_step()``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, is_backward, walk_local
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["grad_overwritten_every_micro_step"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _reads_grad(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in ast.walk(expr))


def _steps_after(ctx: FileContext, loop: ast.AST) -> bool:
    """An optimizer ``.step()`` in the block that holds ``loop``, after it, outside it."""
    parent = ctx.parents.get(loop)
    for field in ("body", "orelse"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and loop in block:
            later = block[block.index(loop) + 1:]
            return any(_steps(ctx, n, 2) for stmt in later for n in ast.walk(stmt))
    return False


def _guarded(ctx: FileContext, node: ast.AST, scope: ast.AST) -> bool:
    """``node`` runs under an ``if`` whose test reads ``.grad`` (inside ``scope``)."""
    up = ctx.parents.get(node)
    while up is not None and up is not scope:
        if isinstance(up, ast.If) and _reads_grad(up.test):
            return True
        up = ctx.parents.get(up)
    return False


def _steps(ctx: FileContext, node: ast.AST, depth: int) -> bool:
    """``node`` is an optimizer step, or a call of a helper of the file that steps
    (``self.sync_and_step()``), followed ``depth`` helpers deep."""
    if ctx.is_step(node):
        return True
    if depth <= 0 or not isinstance(node, ast.Call) or (fn := ctx.callee_of(node)) is None:
        return False
    return any(_steps(ctx, n, depth - 1) for n in walk_local(fn))


@rule("AG167")
def grad_overwritten_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    for node in ctx.of(ast.Assign):
        target = next((t for t in node.targets if isinstance(t, ast.Attribute) and t.attr == "grad"), None)
        if target is None or isinstance(node.value, ast.Constant) or _reads_grad(node.value):
            continue
        fn = ctx.enclosing(node, FUNCS)
        scope: ast.AST = fn if fn is not None else ctx.tree
        if _guarded(ctx, node, scope):
            continue  # `if p.grad is None: p.grad = g else: p.grad.add_(g)`: the first write only
        if any(isinstance(n, ast.Call) and is_backward(n) for n in walk_local(scope)):
            continue
        if not any(isinstance(n, ast.Call) and "autograd" in ast.unparse(n.func)
                   and ast.unparse(n.func).endswith("grad") for n in ast.walk(scope)):
            continue  # gradients made by autograd.grad in that function: the write is the micro-step's
        # the loop over micro-batches: around the write in its function (beyond the loop over
        # the parameters), or around a call of that function
        loops: list[ast.AST] = []
        inner = ctx.enclosing(node, _LOOPS)
        outer = ctx.enclosing(inner, _LOOPS) if inner is not None else None
        if outer is not None and (fn is None or ctx.enclosing(outer, FUNCS) is fn):
            loops.append(outer)
        if fn is not None:
            for site in ctx.call_sites(fn):
                loop = ctx.enclosing(site, _LOOPS)
                if loop is not None:
                    loops.append(loop)
        hit = next((lp for lp in loops if _steps_after(ctx, lp)), None)
        if hit is None:
            continue
        yield ctx.finding(
            "AG167",
            node,
            f"`{ast.unparse(node)}` replaces `.grad` on every micro-step of the loop at line "
            f"{getattr(hit, 'lineno', '?')}, and the optimizer steps after that loop: what the "
            "window's earlier micro-batches left in .grad is overwritten, so only the last "
            "micro-batch's gradient reaches the optimizer",
            fix=f"accumulate instead: `{ast.unparse(target)} = g if {ast.unparse(target)} is None "
                f"else {ast.unparse(target)} + g` (or sum the micro-steps' gradients in buffers "
                "and write them once, before the step)",
        )
