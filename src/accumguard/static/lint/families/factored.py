"""AG146 (LOSS_SCALE): a factor that undoes the engine's averages multiplies a sum whose
other term is not normalised by the window.

A loss normalised by the window's count (``ce_sum / window_tokens``, summed over every rank)
is multiplied back by what the engine divides by: the number of processes (DDP's average)
and K (``accelerator.backward``, DeepSpeed, Lightning). Written around a sum,
``(ce_sum / window_tokens + coef * z_loss) * num_processes * K``, the factor also multiplies
a term that is a per-micro-batch mean (a router z-loss, a regulariser): the engine's
averages were that term's large-batch weighting, so it weighs W x K (or W, or K) times its
share. The factor is known by the names it is built from; a warning.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import flows_to_backward

__all__ = ["factor_over_unnormalised_term"]


def _addends(expr: ast.AST) -> list[ast.AST]:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _addends(expr.left) + _addends(expr.right)
    return [expr]


def _values(ctx: FileContext, node: ast.AST) -> dict[str, ast.AST]:
    fn = ctx.enclosing(node, FUNCS)
    if fn is None:
        return {}
    out: dict[str, ast.AST] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            out[n.targets[0].id] = n.value
    return out


def _engine_factor(ctx: FileContext, expr: ast.AST, values: dict[str, ast.AST],
                   depth: int = 2) -> bool:
    """``expr`` is a product of the world size and/or K (through local names)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return (_engine_factor(ctx, expr.left, values, depth)
                and _engine_factor(ctx, expr.right, values, depth))
    if isinstance(expr, ast.Name) and expr.id in values and depth > 0:
        return _engine_factor(ctx, values[expr.id], values, depth - 1)
    return isinstance(expr, ast.Name | ast.Attribute | ast.Call) and (
        ctx.mentions_world(expr) or ctx.mentions_accum(expr))


def _divided(term: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in walk_all(term))


def _constant(term: ast.AST) -> bool:
    return not any(isinstance(n, ast.Name | ast.Attribute | ast.Call) for n in walk_all(term))


@rule("AG146")
def factor_over_unnormalised_term(ctx: FileContext) -> Iterator[Finding]:
    for node in ctx.of(ast.BinOp):
        if not isinstance(node.op, ast.Mult):
            continue
        for total, factor in ((node.left, node.right), (node.right, node.left)):
            terms = _addends(total)
            if len(terms) < 2:
                continue
            normalised = [t for t in terms if _divided(t)]
            plain = [t for t in terms if not _divided(t) and not _constant(t)]
            if not normalised or not plain:
                continue
            values = _values(ctx, node)
            if not _engine_factor(ctx, factor, values) \
                    or not flows_to_backward(ctx, node, through_returns=True):
                continue
            yield ctx.finding(
                "AG146",
                plain[0],
                f"`{ast.unparse(plain[0])}` is added inside the sum that `{ast.unparse(factor)}` "
                "(built from the number of processes and/or K) multiplies: that factor undoes "
                f"the engine's averages for `{ast.unparse(normalised[0])}`, divided by a count, "
                "but this term divides by nothing: a per-micro-batch value those averages "
                "already weigh as the large batch does, it then weighs that factor times its "
                "large-batch share",
                fix=f"multiply only the normalised term: `{ast.unparse(normalised[0])} * "
                    f"{ast.unparse(factor)} + {ast.unparse(plain[0])}`",
            )
            break
