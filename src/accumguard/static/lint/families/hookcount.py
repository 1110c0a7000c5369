"""Counting the window wrong in two places the loop does not show (AG354, AG355).

AG354 (LOSS_SCALE): a ``register_post_accumulate_grad_hook`` hook that scales ``p.grad``
(``param.grad.div_(K)``, ``p.grad *= 1 / K``). That hook runs after every backward, once the
new gradient has been added to ``.grad``: what it scales is the window's running sum, so the
first micro-batch is divided K times over a window of K, the last once. (A ``register_hook``
on the tensor sees each backward's own gradient, and a division there is the /K meant.)

AG355 (F13): micro-batches numbered from 1 (``enumerate(loader, start=1)``) while the
boundary test adds one more (``(i + 1) % K == 0``, inline or in a method of the file the
index is handed to): the first window of each pass holds K - 1 micro-batches, still divided
by K, and the pass's last micro-batch opens a window that spills into the next pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["grad_scaled_in_post_accumulate_hook", "one_based_index_with_plus_one"]

_SCALE = frozenset({"div_", "mul_"})


def _scales_grad(ctx: FileContext, fn: ast.AST) -> ast.AST | None:
    """The node of ``fn`` that divides a ``.grad`` in place by the accumulation count:
    ``x.grad.div_(K)``, ``x.grad /= K``, ``x.grad = x.grad / K``, ``x.grad.mul_(1 / K)``,
    ``x.grad *= 1 / K`` (a factor that is not K alone, a clip's ``max_norm / norm``, is not
    this)."""
    def by_k(factor: ast.AST, div: bool) -> bool:
        if not div:
            if not (isinstance(factor, ast.BinOp) and isinstance(factor.op, ast.Div)
                    and isinstance(factor.left, ast.Constant) and factor.left.value == 1):
                return False
            factor = factor.right
        return isinstance(factor, ast.Name | ast.Attribute) and ctx.mentions_accum(factor)

    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and call_attr(n) in _SCALE and isinstance(n.func, ast.Attribute) \
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "grad" \
                and len(n.args) == 1 and by_k(n.args[0], call_attr(n) == "div_"):
            return n
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div | ast.Mult) \
                and isinstance(n.target, ast.Attribute) and n.target.attr == "grad" \
                and by_k(n.value, isinstance(n.op, ast.Div)):
            return n
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "grad"
                                             for t in n.targets) \
                and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Div | ast.Mult) \
                and isinstance(n.value.left, ast.Attribute) and n.value.left.attr == "grad" \
                and by_k(n.value.right, isinstance(n.value.op, ast.Div)):
            return n
    return None


def _hook_body(ctx: FileContext, arg: ast.AST) -> ast.AST | None:
    """The lambda, or the function / method of the file, a hook registration is given."""
    if isinstance(arg, ast.Lambda):
        return arg
    name = dotted(arg)
    if name is None:
        return None
    last = name.rsplit(".", 1)[-1]
    defs = ctx.functions_by_name().get(last, [])
    return defs[0] if len(defs) == 1 else None


@rule("AG354")
def grad_scaled_in_post_accumulate_hook(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if call_attr(call) != "register_post_accumulate_grad_hook" or not call.args:
            continue
        body = _hook_body(ctx, call.args[0])
        scaled = _scales_grad(ctx, body) if body is not None else None
        if scaled is None:
            continue
        yield ctx.finding(
            "AG354", call,
            f"the hook `{ast.unparse(call.args[0])}` scales `.grad` "
            f"(`{ast.unparse(scaled)}`, line {getattr(scaled, 'lineno', '?')}) from "
            "register_post_accumulate_grad_hook, which runs after every backward on the "
            "gradient accumulated so far: the window's running sum is scaled again at each "
            "micro-step, so the first micro-batch is divided K times over a window of K and "
            "the last once",
            fix="scale each backward's own gradient instead: divide the loss by K, or use "
                "`p.register_hook(lambda g: g / K)` on the tensor")
        return


def _plus_one_mod(expr: ast.AST, index: str) -> ast.Compare | None:
    """``(index + 1) % K == 0`` in ``expr``, K naming the accumulation."""
    for n in ast.walk(expr):
        if not (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.Eq)
                and isinstance(n.left, ast.BinOp) and isinstance(n.left.op, ast.Mod)):
            continue
        left = n.left.left
        if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add) \
                and isinstance(left.left, ast.Name) and left.left.id == index \
                and isinstance(left.right, ast.Constant) and left.right.value == 1:
            return n
    return None


@rule("AG355")
def one_based_index_with_plus_one(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For):
        it = loop.iter
        if not (isinstance(it, ast.Call) and dotted(it.func) == "enumerate"
                and isinstance(loop.target, ast.Tuple) and loop.target.elts
                and isinstance(loop.target.elts[0], ast.Name)):
            continue
        start = it.args[1] if len(it.args) > 1 else next(
            (k.value for k in it.keywords if k.arg == "start"), None)
        if not (isinstance(start, ast.Constant) and start.value == 1):
            continue
        index = loop.target.elts[0].id
        test = _plus_one_mod(loop, index)
        where = loop
        if test is None:
            for c in ast.walk(loop):
                if not (isinstance(c, ast.Call) and (fn := ctx.callee_of(c)) is not None):
                    continue
                params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
                offset = 1 if params and params[0] in ("self", "cls") else 0
                for i, a in enumerate(c.args):
                    if isinstance(a, ast.Name) and a.id == index and i + offset < len(params):
                        test = _plus_one_mod(fn, params[i + offset])
                        if test is not None:
                            where = fn
                            break
                if test is not None:
                    break
        if test is None or not (isinstance(test.left, ast.BinOp)
                                and any(ctx.mentions_accum(x) for x in ast.walk(test.left.right))):
            continue
        yield ctx.finding(
            "AG355", it,
            f"`{ast.unparse(it)}` numbers the micro-batches from 1, and the boundary test "
            f"`{ast.unparse(test)}` (line {test.lineno}"
            + (f", in `{getattr(where, 'name', '')}`" if where is not loop else "")
            + ") adds one more: the first window of each pass holds K - 1 micro-batches, still "
            "divided by K, and the pass's last micro-batch opens a window that spills into the "
            "next pass",
            fix="count from 0 (`enumerate(loader)`) with `(i + 1) % K == 0`, or test "
                "`i % K == 0` with `start=1`")
