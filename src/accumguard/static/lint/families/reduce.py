"""Hand-written gradient all-reduce rules (F10): average over ranks exactly once.

AG107 gradients all-reduced with SUM and never divided by W (W x G).
AG108 gradients reduced by hand on top of DDP/FSDP, which already averaged them.
AG381 gradients divided by W by hand (no reduction of the script's) on top of DDP/FSDP's average.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    FUNCS,
    GRAD_TENSOR_RE,
    LOOPS,
    call_attr,
    dotted,
    identifiers,
    last_part,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import division, flows_to_backward, is_loss_division
from accumguard.static.lint.families._rankavg import summed_over_ranks
from accumguard.static.lint.families._worldprod import named_product_with_world
from accumguard.static.lint.families.scale import loss_divisions_by_rank_sum
from accumguard.static.lint.families.unreduced import fsdp_ignored, reduces_an_outside_module

_DIV_CALLS = frozenset({"div_", "div", "mul_", "true_divide_", "divide_", "mul"})


def _divides_by_world(ctx: FileContext, scope: ast.AST, near: ast.AST | None = None) -> bool:
    """Anything in ``scope`` divided (``/``, ``/=``, ``*=``, ``div_``...) by a world size,
    including in place on ``.data`` (``p.grad.data /= world``). With ``near`` (the reduce),
    only what can reach its gradients: the outermost loop around it and what runs before
    that loop; a division in a later loop (a single-process reference run after the
    training) does not average the training's gradients."""
    def compute() -> list[ast.AST]:
        out: list[ast.AST] = []
        for sub in walk_all(scope):
            divisor: ast.AST | None = None
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div | ast.Mult):
                divisor = sub.right
            elif isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Div | ast.Mult):
                divisor = sub.value
            elif isinstance(sub, ast.Call) and call_attr(sub) in _DIV_CALLS and sub.args:
                divisor = sub.args[0]
            if divisor is not None and _world_valued(ctx, divisor) \
                    and (not _multiplies(sub) or _reciprocal(ctx, divisor)):
                out.append(sub)
        return out
    divisions: list[ast.AST] = ctx._cached("world_divisions", scope, compute)  # one pass per scope
    loop = _outermost_loop(ctx, near, scope) if near is not None else None
    return any(loop is None or _reaches(ctx, d, loop) for d in divisions)


def _world_valued(ctx: FileContext, expr: ast.AST) -> bool:
    """``expr`` mentions the world size, or reads a name assigned from it (``global_batch =
    micro_bsz * accum * dist.get_world_size()``)."""
    if ctx.mentions_world(expr):
        return True
    memo: dict[str, bool] = ctx._cached("world_valued_names", ctx.tree, dict)
    for n in walk_all(expr):
        if not isinstance(n, ast.Name):
            continue
        if n.id not in memo:  # (a name assigned once: a name assigned everywhere says nothing)
            values = ctx.values_by_name().get(n.id, [])
            memo[n.id] = len(values) == 1 and ctx.mentions_world(values[0])
        if memo[n.id]:
            return True
    return False


def _multiplies(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.Mult)) or (
        isinstance(node, ast.Call) and call_attr(node) in ("mul", "mul_"))


def _reciprocal(ctx: FileContext, factor: ast.AST) -> bool:
    """A factor that divides (``1 / world``, or a name assigned one): ``x * world`` scales a
    size up and averages nothing."""
    values = [factor] + [v for n in walk_all(factor) if isinstance(n, ast.Name)
                         for v in ctx.values_by_name().get(n.id, [])]
    return any(isinstance(x, ast.BinOp) and isinstance(x.op, ast.Div)
               for v in values for x in walk_all(v))


def _outermost_loop(ctx: FileContext, node: ast.AST, scope: ast.AST) -> ast.AST | None:
    out: ast.AST | None = None
    cur = ctx.parents.get(node)
    while cur is not None and cur is not scope:
        if isinstance(cur, LOOPS):
            out = cur
        cur = ctx.parents.get(cur)
    return out


def _reaches(ctx: FileContext, sub: ast.AST, loop: ast.AST) -> bool:
    """``sub`` is inside ``loop``, or before it and in no other loop."""
    if getattr(sub, "lineno", 0) >= getattr(loop, "lineno", 0):
        return getattr(sub, "lineno", 0) <= (getattr(loop, "end_lineno", None) or 0)
    return ctx.enclosing(sub, LOOPS) is None


def _grads_divided_by_world(ctx: FileContext) -> bool:
    """Somewhere in the file a gradient is divided in place by the world size
    (``p.grad.div_(world_size)``, ``p.grad /= W``, ``g.mul_(1 / W)``) or by a count summed
    over every rank (``dist.all_reduce(count); p.grad.div_(count)``: summed losses over the
    samples of all ranks, the large batch's mean)."""
    def averages(divisor: ast.AST) -> bool:
        return ctx.mentions_world(divisor) or summed_over_ranks(ctx, divisor, accelerate=False)

    def grad_like(expr: ast.AST | None) -> bool:
        return expr is not None and any(
            (isinstance(x, ast.Attribute) and x.attr == "grad")
            or (isinstance(x, ast.Name) and GRAD_TENSOR_RE.search(x.id) is not None)
            for x in walk_all(expr))

    def compute() -> bool:
        for sub in ctx.of(ast.Call, ast.AugAssign):
            if isinstance(sub, ast.AugAssign):
                if isinstance(sub.op, ast.Div | ast.Mult) and grad_like(sub.target) \
                        and averages(sub.value):
                    return True
            elif call_attr(sub) in _DIV_CALLS and sub.args and isinstance(sub.func, ast.Attribute) \
                    and grad_like(sub.func.value) and averages(sub.args[0]):
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
        if not any(GRAD_TENSOR_RE.search(i) for i in identifiers(node.args[0])) \
                and not _grad_alias(ctx, node):
            continue
        op_node = next((k.value for k in node.keywords if k.arg == "op"), None)
        if op_node is None and len(node.args) > 1:
            op_node = node.args[1]
        op = last_part(dotted(op_node)) if op_node is not None else "sum"
        if op in ("sum", "avg", "mean", "premul_sum"):
            yield node, op  # another op (a variable) cannot be read statically: no guess


def _grad_alias(ctx: FileContext, node: ast.Call) -> bool:
    """The reduced tensor is a name its function binds once to a ``.grad`` (``g =
    module.codebook.grad``)."""
    arg = node.args[0]
    if not isinstance(arg, ast.Name):
        return False
    values = ctx.assigned_in(ctx.scope_of(node)).get(arg.id, [])
    return len(values) == 1 and isinstance(values[0], ast.Attribute) and values[0].attr == "grad"


def ddp_ignored(ctx: FileContext) -> set[str]:
    """Names of parameters the file tells DDP to leave alone
    (``DDP._set_params_and_buffers_to_ignore_for_model(net, ["codebook"])``, a module's
    ``_ddp_params_and_buffers_to_ignore``), or FSDP2 (``fully_shard(..., ignored_params=...)``):
    the wrapper never averages their gradients (once per file: every reduction asks)."""
    return ctx._cached("ddp_ignored", ctx.tree, lambda: _ddp_ignored(ctx))  # type: ignore[no-any-return]


def _ddp_ignored(ctx: FileContext) -> set[str]:
    out: set[str] = {n for _, names in fsdp_ignored(ctx) for n in names}
    for call in ctx.of(ast.Call):
        if call_attr(call) == "_set_params_and_buffers_to_ignore_for_model" and len(call.args) > 1 \
                and isinstance(call.args[1], ast.List | ast.Tuple | ast.Set):
            out |= {e.value.rsplit(".", 1)[-1] for e in call.args[1].elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    for n in ctx.of(ast.Assign):
        if any((dotted(t) or "").endswith("_ddp_params_and_buffers_to_ignore") for t in n.targets) \
                and isinstance(n.value, ast.List | ast.Tuple | ast.Set):
            out |= {e.value.rsplit(".", 1)[-1] for e in n.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return out


def _reduces_ignored(ctx: FileContext, node: ast.Call) -> bool:
    """The reduction's tensor is the gradient of a parameter DDP ignores."""
    ignored = ddp_ignored(ctx)
    if not ignored:
        return False
    exprs: list[ast.AST] = [node.args[0]]
    if isinstance(node.args[0], ast.Name):
        exprs += ctx.assigned_in(ctx.scope_of(node)).get(node.args[0].id, [])
    return any(isinstance(n, ast.Attribute) and n.attr in ignored
               for e in exprs for n in walk_all(e))


def _loss_divided_by_world(ctx: FileContext) -> bool:
    """A loss that reaches a backward is divided by the world size or by a count made with it
    as a factor (``n_window = micro * K * world``): the ranks' summed gradients are then the
    mean over every rank's data."""
    def compute() -> bool:
        for node in ctx.of(ast.BinOp, ast.AugAssign):
            d = division(node)
            if d is not None and (ctx.mentions_world(d[1]) or named_product_with_world(ctx, d[1])) \
                    and is_loss_division(ctx, node, d[0]) and flows_to_backward(ctx, node):
                return True
        return False
    return bool(ctx._cached("loss_divided_by_world", ctx.tree, compute))


def _in_unused_function(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` is in a function of a script (a file with an ``if __name__ == "__main__":``
    entry) that nothing calls and nothing refers to: a leftover helper (a hook handed to a
    registration is referred to; a library module's functions are called from elsewhere)."""
    fn = ctx.enclosing(node, FUNCS)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or not ctx._cached(
            "main_entry", ctx.tree, lambda: any(isinstance(st, ast.If) and "__main__" in ast.unparse(st.test)
                                                for st in ctx.tree.body)):
        return False
    def compute() -> frozenset[str]:
        return frozenset({n.id for n in ast.walk(ctx.tree) if isinstance(n, ast.Name)}
                         | {n.attr for n in ast.walk(ctx.tree) if isinstance(n, ast.Attribute)})
    referenced: frozenset[str] = ctx._cached("referenced_names", ctx.tree, compute)
    return fn.name not in referenced


@rule("AG107")
def all_reduce_sum_without_average(ctx: FileContext) -> Iterator[Finding]:
    for node, op in _gradient_reduces(ctx):
        if _in_unused_function(ctx, node):
            continue  # a helper the file defines and never calls nor hands over
        if ctx.ddp_wrapped and not _under_wrapper_branch(ctx, node) \
                and not _reduces_ignored(ctx, node):
            continue  # AG108's case (a parameter DDP ignores is this rule's)
        if op in ("avg", "mean", "premul_sum") or _divides_by_world(ctx, ctx.scope_of(node), node):
            continue
        cls = ctx.enclosing(node, (ast.ClassDef,))
        if (cls is not None and _divides_by_world(ctx, cls)) or _grads_divided_by_world(ctx):
            continue  # a sibling method (`finalize`) or another function divides them
        if any(loss_divisions_by_rank_sum(ctx, accelerate=False)) or _loss_divided_by_world(ctx):
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
        if _under_wrapper_branch(ctx, node) or reduces_an_outside_module(ctx, node) \
                or _reduces_ignored(ctx, node) or _in_unused_function(ctx, node):
            continue
        divided = _divides_by_world(ctx, ctx.scope_of(node))
        restores = op == "sum" and not divided and any(
            loss_divisions_by_rank_sum(ctx, accelerate=False))
        yield ctx.finding(
            "AG108",
            node,
            "gradients are all-reduced by hand although the model is wrapped in DDP/FSDP, which "
            f"already averaged them: op {op.upper()} "
            + ("then a division gives the same gradient at twice the communication"
               if divided or op in ("avg", "mean")
               else "multiplies DDP's average by the world size, which with the loss divided "
               "by a count summed over every rank gives the large batch's mean: the same "
               "gradient at twice the communication" if restores
               else "multiplies the gradient by the world size"),
            **({"fix": "drop the hand SUM and multiply the loss by the world size instead "
                       "(DDP's average then gives the same mean)"} if restores else {}),
        )


def _grad_world_division(ctx: FileContext) -> ast.AST | None:
    """The first in-place division of a gradient by the world size (``p.grad.div_(world)``,
    ``p.grad /= W``, ``g.mul_(1 / W)``), outside a branch for an unwrapped model."""
    def grad_like(expr: ast.AST | None) -> bool:
        return expr is not None and any(
            (isinstance(x, ast.Attribute) and x.attr == "grad")
            or (isinstance(x, ast.Name) and GRAD_TENSOR_RE.search(x.id) is not None)
            for x in walk_all(expr))
    for sub in ctx.of(ast.Call, ast.AugAssign):
        if isinstance(sub, ast.AugAssign):
            hit = isinstance(sub.op, ast.Div) and grad_like(sub.target) and ctx.mentions_world(sub.value)
        else:
            hit = (call_attr(sub) in ("div_", "true_divide_", "divide_") and bool(sub.args)
                   and isinstance(sub.func, ast.Attribute) and grad_like(sub.func.value)
                   and ctx.mentions_world(sub.args[0]))
        if hit and not _under_wrapper_branch(ctx, sub) and not _in_unused_function(ctx, sub):
            found: ast.AST = sub
            return found
    return None


def _loss_times_world(ctx: FileContext) -> bool:
    """A loss is multiplied by the world size somewhere (``loss * world / n_global``): a
    division of the gradients by W may be its undoing."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
               and any(ctx.mentions_world(side) for side in (n.left, n.right))
               for n in ctx.of(ast.BinOp))


@rule("AG381")
def grads_divided_by_world_under_ddp(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.ddp_wrapped or any(True for _ in _gradient_reduces(ctx)):
        return  # (a hand reduction is AG107's or AG108's)
    node = _grad_world_division(ctx)
    if node is None or _loss_times_world(ctx):
        return
    yield ctx.finding(
        "AG381",
        node,
        "the gradients are divided by the world size by hand, with no reduction of the "
        "script's own, while the model is wrapped in DDP/FSDP, whose backward already "
        "averaged them over the ranks: the optimizer receives G / W",
    )
