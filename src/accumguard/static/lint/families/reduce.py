"""Hand-written gradient all-reduce rules (F10): average over ranks exactly once.

AG107 gradients all-reduced with SUM and never divided by W (W x G).
AG108 gradients reduced by hand on top of DDP/FSDP, which already averaged them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    GRAD_TENSOR_RE,
    call_attr,
    dotted,
    identifiers,
    last_part,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.scale import loss_divisions_by_rank_sum

_DIV_CALLS = frozenset({"div_", "div", "mul_", "true_divide_", "divide_", "mul"})


def _divides_by_world(ctx: FileContext, scope: ast.AST) -> bool:
    """Anything in ``scope`` divided (``/``, ``/=``, ``*=``, ``div_``...) by a world size,
    including in place on ``.data`` (``p.grad.data /= world``)."""
    def compute() -> bool:
        for sub in walk_all(scope):
            divisor: ast.AST | None = None
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div | ast.Mult):
                divisor = sub.right
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Div | ast.Mult):
                divisor = sub.value
            elif isinstance(sub, ast.Call) and call_attr(sub) in _DIV_CALLS and sub.args:
                divisor = sub.args[0]
            if divisor is not None and ctx.mentions_world(divisor):
                return True
        return False
    return bool(ctx._cached("divides_world", scope, compute))


def _grads_divided_by_world(ctx: FileContext) -> bool:
    """Somewhere in the file a gradient is divided by the world size in place
    (``p.grad.div_(world_size)``, ``p.grad /= W``, ``g.mul_(1 / W)``)."""
    def grad_like(expr: ast.AST | None) -> bool:
        return expr is not None and any(
            (isinstance(x, ast.Attribute) and x.attr == "grad")
            or (isinstance(x, ast.Name) and GRAD_TENSOR_RE.search(x.id) is not None)
            for x in walk_all(expr))

    def compute() -> bool:
        for sub in ctx.of(ast.Call, ast.AugAssign):
            if isinstance(sub, ast.AugAssign):
                if isinstance(sub.op, ast.Div | ast.Mult) and grad_like(sub.target) \
                        and ctx.mentions_world(sub.value):
                    return True
            elif call_attr(sub) in _DIV_CALLS and sub.args and isinstance(sub.func, ast.Attribute) \
                    and grad_like(sub.func.value) and ctx.mentions_world(sub.args[0]):
                return True
        return False
    return bool(ctx._cached("grads_divided_world", ctx.tree, compute))


def _under_wrapper_branch(ctx: FileContext, node: ast.AST) -> bool:
    """Under an ``if`` that switches on the wrapper (``if not use_ddp:``): the manual
    reduction is then the non-DDP path, not a second average."""
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        if isinstance(cur, ast.If) and any(
            re.search(r"ddp|fsdp|wrap|distributed|parallel|shard", i) for i in identifiers(cur.test)
        ):
            return True
        cur = ctx.parents.get(cur)
    return False


def _gradient_reduces(ctx: FileContext) -> Iterator[tuple[ast.Call, str]]:
    if not ctx.is_training_script():
        return
    for node in ctx.of(ast.Call):
        if call_attr(node) not in ("all_reduce", "all_reduce_coalesced") or not node.args:
            continue
        if not any(GRAD_TENSOR_RE.search(i) for i in identifiers(node.args[0])):
            continue
        op_node = next((k.value for k in node.keywords if k.arg == "op"), None)
        if op_node is None and len(node.args) > 1:
            op_node = node.args[1]
        op = last_part(dotted(op_node)) if op_node is not None else "sum"
        if op in ("sum", "avg", "mean", "premul_sum"):
            yield node, op  # another op (a variable) cannot be read statically: no guess


@rule("AG107")
def all_reduce_sum_without_average(ctx: FileContext) -> Iterator[Finding]:
    for node, op in _gradient_reduces(ctx):
        if ctx.ddp_wrapped and not _under_wrapper_branch(ctx, node):
            continue  # AG108's case
        if op in ("avg", "mean", "premul_sum") or _divides_by_world(ctx, ctx.scope_of(node)):
            continue
        cls = ctx.enclosing(node, (ast.ClassDef,))
        if (cls is not None and _divides_by_world(ctx, cls)) or _grads_divided_by_world(ctx):
            continue  # a sibling method (`finalize`) or another function divides them
        if any(loss_divisions_by_rank_sum(ctx, accelerate=False)):
            continue  # the loss's count spans every rank: the summed gradients are the mean
        yield ctx.finding(
            "AG107",
            node,
            f"gradients are all-reduced with {op.upper()} and never divided by the world size: "
            "the optimizer receives W times the averaged gradient",
        )


@rule("AG108")
def reduce_on_top_of_ddp(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.ddp_wrapped:
        return
    for node, op in _gradient_reduces(ctx):
        if _under_wrapper_branch(ctx, node):
            continue
        divided = _divides_by_world(ctx, ctx.scope_of(node))
        yield ctx.finding(
            "AG108",
            node,
            "gradients are all-reduced by hand although the model is wrapped in DDP/FSDP, which "
            f"already averaged them: op {op.upper()} "
            + ("then a division gives the same gradient at twice the communication"
               if divided or op in ("avg", "mean")
               else "multiplies the gradient by the world size"),
        )
