"""AG145 (F4): an iteration horizon converted from a token (or sample) budget by the size
of one micro-batch, in a file whose iteration takes K micro-batches.

nanoGPT-style loops give their schedule in tokens and convert it to optimizer iterations:
``max_iters = max_tokens // tokens_per_iter`` with ``tokens_per_iter = K * B * T``. A second
conversion of the same kind that divides by one micro-batch's tokens (``warmup_iters =
warmup_tokens // (B * T)``) counts micro-batches: the horizon is K times what the tokens
say (a warmup K times longer, a decay that ends K times later). A conversion is read
inline or through a helper of the file (``tokens_to_iters(n)`` returning ``n // (B * T)``).
The file proves both conversions and which one holds K; whether the longer horizon was meant is not in sight,
hence a warning.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted, label, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["horizon_from_micro_batch_tokens"]

#: a budget in data units (not in steps)
_BUDGET = re.compile(r"tokens?|samples?|examples?|sequences?", re.IGNORECASE)
#: a horizon counted in optimizer iterations
_HORIZON = re.compile(r"warmup|warm_up|decay|max_iters?|max_steps|total_steps|train_steps|"
                      r"num_training_steps|cooldown|anneal", re.IGNORECASE)


def _conversion(value: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(budget, divisor) of ``budget // d``, ``budget / d``, ``int(budget / d)``,
    ``math.ceil(budget / d)`` when the budget is named in data units."""
    while isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords \
            and (dotted(value.func) or "").rsplit(".", 1)[-1] in ("int", "ceil", "floor", "round"):
        value = value.args[0]
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.FloorDiv | ast.Div) \
            and _BUDGET.search(label(value.left)):
        return value.left, value.right
    return None


def _has_k(ctx: FileContext, values: Mapping[str, ast.AST], expr: ast.AST, depth: int = 3) -> bool:
    """``expr`` mentions K, directly or through names assigned in the same scope."""
    if ctx.mentions_accum(expr):
        return True
    if depth <= 0:
        return False
    return any(isinstance(n, ast.Name) and n.id in values
               and _has_k(ctx, values, values[n.id], depth - 1) for n in walk_all(expr))


def _through_helper(ctx: FileContext, value: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """``tokens_to_iters(warmup_tokens)`` where the file's ``tokens_to_iters(n)`` returns
    ``n // d`` (its one ``return``): (the budget given, ``d``)."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and len(value.args) == 1 and not value.keywords
            and _BUDGET.search(label(value.args[0]))):
        return None
    defs = ctx.defs_by_name().get(value.func.id, [])
    if len(defs) != 1 or len(defs[0].args.args) != 1:
        return None
    rets = [r for r in walk_all(defs[0]) if isinstance(r, ast.Return) and r.value is not None]
    if len(rets) != 1 or rets[0].value is None:
        return None
    ret: ast.AST = rets[0].value
    while isinstance(ret, ast.Call) and len(ret.args) == 1 and not ret.keywords \
            and (dotted(ret.func) or "").rsplit(".", 1)[-1] in ("int", "ceil", "floor", "round"):
        ret = ret.args[0]
    param = defs[0].args.args[0].arg
    if isinstance(ret, ast.BinOp) and isinstance(ret.op, ast.FloorDiv | ast.Div) \
            and isinstance(ret.left, ast.Name) and ret.left.id == param:
        return value.args[0], ret.right
    return None


@rule("AG145")
def horizon_from_micro_batch_tokens(ctx: FileContext) -> Iterator[Finding]:
    scopes: list[ast.AST] = [ctx.tree, *ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)]
    for fn in scopes:
        convs: list[tuple[ast.Assign, str, ast.AST, ast.AST]] = []
        body = ctx.tree.body if fn is ctx.tree else ctx.local_nodes(fn)
        values = {t.id: n.value for n in body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target = dotted(node.targets[0]) or ""
            conv = _conversion(node.value) or _through_helper(ctx, node.value)
            if conv is not None:
                convs.append((node, target, conv[0], conv[1]))
        with_k = [c for c in convs if _has_k(ctx, values, c[3])]
        if not with_k:
            continue
        for node, target, budget, divisor in convs:
            if _has_k(ctx, values, divisor) or not _HORIZON.search(target):
                continue
            if not any(isinstance(n, ast.Name | ast.Attribute | ast.Subscript)
                       for n in walk_all(divisor)):
                continue  # a literal divisor: not a micro-batch's size in sight
            ref = with_k[0]
            yield ctx.finding(
                "AG145",
                node,
                f"`{target}` converts `{ast.unparse(budget)}` into iterations by "
                f"`{ast.unparse(divisor)}`, which holds no K, while "
                f"`{ref[1]} = {ast.unparse(ref[0].value)}` counts an iteration as the K "
                "micro-batches it accumulates: if that divisor is one micro-batch's size, this "
                "horizon is K times what its budget says (the schedule reaches it K times "
                "later)",
                fix=f"divide `{ast.unparse(budget)}` by what one iteration takes, as "
                    f"`{ref[1]}` does (`{ast.unparse(ref[3])}`)",
            )
