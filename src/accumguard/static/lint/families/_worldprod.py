"""A divisor named for a product that has the world size as a factor (``global_batch =
micro_bsz * K * world_size``): read by AG112, which judges a loss divided by it under
DDP/FSDP's own average over the ranks (G / W)."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext

__all__ = ["named_product_with_world"]


def _product_factors(expr: ast.AST) -> list[ast.AST] | None:
    """The factors of a product ``a * b * c`` (None when ``expr`` is no product)."""
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult)):
        return None
    out: list[ast.AST] = []
    for side in (expr.left, expr.right):
        out += _product_factors(side) or [side]
    return out


def named_product_with_world(ctx: FileContext, divisor: ast.AST) -> bool:
    """The divisor is a name (``global_batch``, ``self.global_bsz``) that every assignment of
    the file makes a product with the world size as a factor (``micro * K * world_size``,
    ``... * dist.get_world_size()``): dividing by it divides by W."""
    name = dotted(divisor)
    if name is None or not isinstance(divisor, ast.Name | ast.Attribute):
        return False
    values = ctx.values_by_name().get(name, [])
    if not values:
        return False
    for v in values:
        factors = _product_factors(v)
        if factors is None or not any(ctx.mentions_world(f) for f in factors):
            return False
    return True
