"""Hand accumulation: a loop that adds each parameter's ``.grad`` into a buffer of its own
after every backward clears ``.grad`` on purpose (AG102 is not F3 there)."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import call_attr, is_backward, position, walk_all
from accumguard.static.lint._context import FileContext

__all__ = ["harvests_grads"]


def harvests_grads(ctx: FileContext, window: ast.AST) -> bool:
    """After a backward, the window adds each parameter's ``.grad`` into a buffer of its own
    (``acc += p.grad.float()``, ``buf.add_(p.grad)``, ``acc[i] = acc[i] + p.grad``): it
    accumulates by hand (in fp32, say) and clears ``.grad`` at every micro-step on purpose."""
    nodes = list(ctx.local_nodes(window))
    backwards = [position(n) for n in nodes if isinstance(n, ast.Call) and is_backward(n)]
    if not backwards:
        return False
    first = min(backwards)

    def reads_grad(e: ast.AST | None) -> bool:
        return e is not None and any(isinstance(a, ast.Attribute) and a.attr == "grad"
                                     and isinstance(a.ctx, ast.Load) for a in walk_all(e))

    for n in nodes:
        if position(n) < first:
            continue
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and reads_grad(n.value):
            return True
        if isinstance(n, ast.Call) and call_attr(n) in ("add_", "copy_", "append") and any(
                reads_grad(a) for a in n.args):
            return True
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript) and isinstance(
                n.value, ast.BinOp) and isinstance(n.value.op, ast.Add) and reads_grad(n.value):
            return True
    return False
