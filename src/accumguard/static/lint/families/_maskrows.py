"""A mean-reduced loss over the rows a boolean mask selects (``F.cross_entropy(logits[mask],
target[mask])``): a mean over as many elements as the mask holds in each micro-batch, read
by the token-mean hints of AG104 (:mod:`._masked`)."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import call_attr
from accumguard.static.lint._context import FileContext

__all__ = ["mean_over_masked_rows"]


def mean_over_masked_rows(ctx: FileContext, scope: ast.AST, call: ast.Call) -> bool:
    """``F.cross_entropy(logits[mask], target[mask])`` (mean reduction): a mean over the
    elements a boolean mask selects, as many as the mask holds in this micro-batch. The
    index names a mask, or is a name ``scope`` assigns from one or from a comparison."""
    if call_attr(call) not in ("cross_entropy", "nll_loss") or not call.args:
        return False
    if any(k.arg == "reduction" for k in call.keywords):
        return False
    x = call.args[0]
    if not isinstance(x, ast.Subscript):
        return False
    index: list[ast.AST] = [x.slice]
    if isinstance(x.slice, ast.Name):
        values = ctx.assigned_in(scope).get(x.slice.id, [])
        if any(isinstance(v, ast.Compare) for v in values):
            return True
        index += values
    for part in index:
        for n in ast.walk(part):
            ident = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) \
                else n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else ""
            if "mask" in ident.lower():
                return True
    return False
