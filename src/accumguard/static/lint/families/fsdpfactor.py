"""FSDP2's gradient divide factor set to K without the world size (F10): AG323.

``fully_shard`` modules reduce-scatter the sum of the ranks' gradients and divide it by
the world size W, unless ``set_gradient_divide_factor(f)`` replaces W by f. A loop that
backwards each micro-batch's mean undivided and lets FSDP2 divide by ``K * W`` gets the
large batch's mean; ``f = K`` alone leaves the ranks' gradients summed, not averaged: W
times the large batch's gradient. Reported when the factor's expression reads K (a name
of the accumulation) and nothing of the world size. Silent for ``K * W``, for W alone and
for a factor that reads no K.

AG345 (LOSS_SCALE): the factor is K x W (read through a property or method of a class of the
file too) and the loss is also divided by K before its backward: FSDP2's division by K x W
and the loss's by K divide the window's gradient by K twice.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import divides_by_k

__all__ = ["divide_factor_k_and_loss_over_k", "divide_factor_without_world", "resolved_factor"]

_WORLD = ("world", "num_processes", "nprocs", "ranks", "get_world_size", "dp_size")


def _mentions_world(node: ast.AST) -> bool:
    for n in walk_all(node):
        name = (dotted(n) or "").rsplit(".", 1)[-1].lower() if isinstance(
            n, ast.Name | ast.Attribute) else (call_attr(n) or "").lower() if isinstance(
            n, ast.Call) else ""
        if name and any(w in name for w in _WORLD):
            return True
    return False


@rule("AG323")
def divide_factor_without_world(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if call_attr(call) != "set_gradient_divide_factor" or len(call.args) != 1:
            continue
        factor = call.args[0]
        if not ctx.mentions_accum(factor) or _mentions_world(factor):
            continue
        yield ctx.finding(
            "AG323", call,
            f"`{ast.unparse(call)}`: FSDP2 divides the reduce-scatter's sum over the ranks by "
            "this factor instead of the world size, and it holds K but no world size: the "
            "ranks' gradients are summed, not averaged (W x the large batch's gradient)")


def resolved_factor(ctx: FileContext, factor: ast.AST) -> ast.AST:
    """``factor``, or the one return of the property/method of a class of the file it reads
    (``cfg.grad_divide_factor`` -> ``self.world_size * self.accum_steps``), or the one value
    of the name it is."""
    if isinstance(factor, ast.Attribute | ast.Call):
        attr = factor.attr if isinstance(factor, ast.Attribute) else call_attr(factor)
        for cls in ctx.of(ast.ClassDef):
            fn = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == attr),
                      None)
            rets = [r for r in walk_all(fn) if isinstance(r, ast.Return) and r.value is not None] \
                if fn is not None else []
            if len(rets) == 1 and rets[0].value is not None:
                return rets[0].value
    if isinstance(factor, ast.Name):
        values = ctx.values_by_name().get(factor.id, [])
        if len(values) == 1:
            return values[0]
    return factor


@rule("AG345")
def divide_factor_k_and_loss_over_k(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if call_attr(call) != "set_gradient_divide_factor" or len(call.args) != 1:
            continue
        factor = resolved_factor(ctx, call.args[0])
        if not (ctx.mentions_accum(factor) and _mentions_world(factor)):
            continue
        divided = next((sub for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)
                        for sub, _ in divides_by_k(ctx, fn)), None)
        if divided is None:
            continue
        yield ctx.finding(
            "AG345", call,
            f"`{ast.unparse(call)}` makes FSDP2 divide the ranks' summed gradient by "
            f"`{ast.unparse(factor)}` (K x W), and the loss is divided by K as well "
            f"(`{ast.unparse(divided)}`, line {getattr(divided, 'lineno', '?')}): divided by K twice, the "
            "update is 1/K of the large batch's")
