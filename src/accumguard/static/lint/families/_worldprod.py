"""A divisor named for a product that has the world size as a factor (``global_batch =
micro_bsz * K * world_size``), or a count the file itself divides by the world size to get
each rank's share (``accum = micro_batches_per_step // world``): read by AG112, which judges a
loss divided by it under DDP/FSDP's own average over the ranks (G / W)."""

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
    if _split_over_world(ctx, name):
        return True
    values = ctx.values_by_name().get(name, [])
    if not values:
        return False
    for v in values:
        factors = _product_factors(v)
        if factors is None or not any(ctx.mentions_world(f) for f in factors):
            return False
    return True


def _split_over_world(ctx: FileContext, name: str) -> bool:
    """The file assigns ``name // world`` (or ``/``) to something: ``name`` counts the items of
    every rank, a rank's share being its quotient by the world size."""
    def compute() -> frozenset[str]:
        out: set[str] = set()
        for target, values in ctx.values_by_name().items():
            for v in values:
                if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div | ast.FloorDiv) \
                        and isinstance(v.left, ast.Name | ast.Attribute) and ctx.mentions_world(v.right) \
                        and (left := dotted(v.left)) is not None and left != target:
                    out.add(left)  # (``n = n / world`` rebinds the name to the share itself)
        return frozenset(out)
    split: frozenset[str] = ctx._cached("split_over_world", ctx.tree, compute)
    return name in split
