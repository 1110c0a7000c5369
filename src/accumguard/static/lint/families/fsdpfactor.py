"""FSDP2's gradient divide factor set to K without the world size (F10): AG323.

``fully_shard`` modules reduce-scatter the sum of the ranks' gradients and divide it by
the world size W, unless ``set_gradient_divide_factor(f)`` replaces W by f. A loop that
backwards each micro-batch's mean undivided and lets FSDP2 divide by ``K * W`` gets the
large batch's mean; ``f = K`` alone leaves the ranks' gradients summed, not averaged: W
times the large batch's gradient. Reported when the factor's expression reads K (a name
of the accumulation) and nothing of the world size. Silent for ``K * W``, for W alone and
for a factor that reads no K.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["divide_factor_without_world"]

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
