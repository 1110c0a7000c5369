"""A loss multiplied by the world size over a count the ranks averaged (F10): AG321.

Normalising by the window's token count across ranks under an engine that averages the
ranks' gradients takes ``loss_sum * W / N`` with ``N`` the *sum* of the ranks' counts (the
engine's 1/W cancels the W). A count reduced with a mean — Fabric's ``all_reduce`` (its
``reduce_op`` defaults to ``"mean"``), ``accelerator.reduce(n, "mean")``,
``dist.all_reduce(n, op=ReduceOp.AVG)`` — is ``N / W``: with the ``* W`` as well, every
token weighs W times its large-batch weight. Reported when a loss expression multiplies by
the world size and divides by a name assigned from such a mean reduction (or reduced in
place with ``AVG``). Silent for a sum reduction, and for a mean count without the ``* W``
(``loss_sum / (N / W)`` under the engine's average is the large batch's weight).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["loss_times_world_over_mean_count"]

_WORLD = ("world_size", "num_processes", "world", "n_ranks", "num_ranks", "nprocs")


def _mean_reduction(call: ast.AST) -> str | None:
    """The text of a call that returns the ranks' mean of its argument, else None."""
    if not isinstance(call, ast.Call):
        return None
    attr = call_attr(call)
    op = next((k.value for k in call.keywords if k.arg in ("reduce_op", "reduction", "op")), None)
    text = ast.unparse(op).lower() if op is not None else ""
    if attr == "all_reduce" and "fabric" in (dotted(call.func) or "").lower():
        return ast.unparse(call) if op is None or "mean" in text or "avg" in text else None
    if attr == "reduce" and "accelerator" in (dotted(call.func) or "").lower():
        if op is None and len(call.args) > 1:
            op = call.args[1]
            text = ast.unparse(op).lower()
        return ast.unparse(call) if "mean" in text else None
    return None


def _in_place_avg(ctx: FileContext, scope: ast.AST, name: str) -> ast.Call | None:
    for n in ctx.local_nodes(scope):
        if isinstance(n, ast.Call) and call_attr(n) == "all_reduce" and n.args \
                and isinstance(n.args[0], ast.Name) and n.args[0].id == name:
            op = next((k.value for k in n.keywords if k.arg == "op"),
                      n.args[1] if len(n.args) > 1 else None)
            if op is not None and "AVG" in ast.unparse(op):
                return n
    return None


def _world(ctx: FileContext, scope: ast.AST, node: ast.AST) -> bool:
    """The world size: by its name, ``get_world_size()``, or a local name every assignment
    of which gives it one of those (``K, W = k, accelerator.num_processes``)."""
    d = (dotted(node) or "").rsplit(".", 1)[-1].lower()
    if d in _WORLD:
        return True
    if isinstance(node, ast.Call):
        return (call_attr(node) or "") == "get_world_size"
    if isinstance(node, ast.Name):
        values = _values(ctx, scope, node.id)
        return bool(values) and all(_world(ctx, scope, v) for v in values
                                    if not isinstance(v, ast.Name) or v.id != node.id)
    return False


def _values(ctx: FileContext, scope: ast.AST, name: str) -> list[ast.AST]:
    """The values ``name`` is assigned in ``scope`` (tuple targets paired with tuple values)."""
    out: list[ast.AST] = []
    for n in ctx.local_nodes(scope):
        if not isinstance(n, ast.Assign):
            continue
        for t in n.targets:
            if isinstance(t, ast.Name) and t.id == name:
                out.append(n.value)
            elif isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) \
                    and len(t.elts) == len(n.value.elts):
                out += [v for x, v in zip(t.elts, n.value.elts, strict=True)
                        if isinstance(x, ast.Name) and x.id == name]
    return out


def _count_sources(ctx: FileContext, scope: ast.AST, name: str) -> list[ast.AST]:
    """What ``name`` holds: its local values, or, for a parameter of ``scope``, the values
    of the names its callers pass for it (one call level up)."""
    local = _values(ctx, scope, name)
    if local or not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return local
    params = [a.arg for a in scope.args.posonlyargs + scope.args.args]
    if name not in params:
        return []
    idx = params.index(name) - (1 if params and params[0] == "self" else 0)
    out: list[ast.AST] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) != scope.name and not (isinstance(call.func, ast.Name)
                                                  and call.func.id == scope.name):
            continue
        arg = next((k.value for k in call.keywords if k.arg == name),
                   call.args[idx] if 0 <= idx < len(call.args) else None)
        if isinstance(arg, ast.Name):
            out += _values(ctx, ctx.scope_of(call), arg.id)
        elif arg is not None:
            out.append(arg)
    return out


def _mean_source(ctx: FileContext, value: ast.AST) -> str | None:
    """A mean reduction, inline or the one return of a function of the file it calls."""
    found = _mean_reduction(value)
    if found is not None or not isinstance(value, ast.Call):
        return found
    fn = ctx.callee_of(value)
    rets = [n for n in walk_all(fn) if isinstance(n, ast.Return) and n.value is not None] \
        if fn is not None else []
    if len(rets) == 1 and rets[0].value is not None \
            and (inner := _mean_reduction(rets[0].value)) is not None:
        return f"{ast.unparse(value)}, which returns {inner}"
    return None


def _factors(expr: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The multiplied and divided factors of a product/quotient chain."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        a, b = _factors(expr.left), _factors(expr.right)
        return a[0] + b[0], a[1] + b[1]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        a, b = _factors(expr.left), _factors(expr.right)
        return a[0] + b[1], a[1] + b[0]
    return [expr], []


@rule("AG321")
def loss_times_world_over_mean_count(ctx: FileContext) -> Iterator[Finding]:
    for binop in ctx.of(ast.BinOp):
        if not isinstance(binop.op, ast.Div | ast.Mult) \
                or isinstance(ctx.parents.get(binop), ast.BinOp):
            continue  # (the whole chain: `x / n * W` is a product over a quotient)
        up, down = _factors(binop)
        scope = ctx.scope_of(binop)
        if not down or not any(_world(ctx, scope, f) for f in up):
            continue
        for d in down:
            if not isinstance(d, ast.Name):
                continue
            mean = next((m for v in _count_sources(ctx, scope, d.id)
                         if (m := _mean_source(ctx, v))), None)
            if mean is None and (inplace := _in_place_avg(ctx, scope, d.id)) is not None:
                mean = ast.unparse(inplace)
            if mean is None or not any(isinstance(n, ast.Name | ast.Attribute | ast.Call)
                                       for n in walk_all(binop)):
                continue
            yield ctx.finding(
                "AG321", binop,
                f"`{ast.unparse(binop)}` multiplies by the world size and divides by "
                f"`{d.id}` from `{mean}`, the ranks' mean of the count (N / W, not the "
                "total N): with the engine's average over the ranks every token weighs "
                "W x its large-batch weight")
            break
