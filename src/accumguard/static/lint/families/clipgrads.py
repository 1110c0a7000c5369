"""A norm or value clip handed the gradients instead of the parameters (F8): AG160.

``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` (and ``clip_grad_value_``) reads
the ``.grad`` of each tensor it is given and scales that in place. Given the gradients
themselves (``[p.grad for p in model.parameters()]``, FSDP2's local shards
``p.grad.to_local()``, detached copies), it finds no ``.grad`` on any of them: it measures
a norm of 0, clips nothing, and the optimizer steps on the unclipped gradient. (``torch.nn.
utils.get_total_norm`` takes gradients and is another function.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["clip_given_gradients"]

_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"})


def _a_gradient(expr: ast.AST) -> bool:
    """``p.grad``, or a method chain on it (``p.grad.to_local()``, ``p.grad.detach()``)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        expr = expr.func.value
    return isinstance(expr, ast.Attribute) and expr.attr == "grad"


def _gradients(ctx: FileContext, arg: ast.AST) -> ast.AST | None:
    """The comprehension (or list) of gradients ``arg`` is, directly or through a name the
    file assigns once; None otherwise."""
    if isinstance(arg, ast.Name):
        values = ctx.values_by_name().get(arg.id, [])
        arg = values[0] if len(values) == 1 else arg
    if isinstance(arg, ast.ListComp | ast.GeneratorExp) and _a_gradient(arg.elt):
        return arg
    if isinstance(arg, ast.List) and arg.elts and all(_a_gradient(e) for e in arg.elts):
        return arg
    return None


@rule("AG160")
def clip_given_gradients(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] not in _CLIPS or not call.args:
            continue
        grads = _gradients(ctx, call.args[0])
        if grads is None:
            continue
        yield ctx.finding(
            "AG160",
            call,
            f"`{ast.unparse(call.func)}` is given gradients (`{ast.unparse(grads)}`), not "
            "parameters: it reads the `.grad` of each tensor it is given, which these do not "
            "have, so it measures a norm of 0 and clips nothing; the optimizer steps on the "
            "unclipped gradient",
        )
