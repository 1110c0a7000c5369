"""AG133 (LOSS_SCALE): the loss divided by K in a function of the file and divided by K again
where that function's result is used, before the backward.

A helper (a module function or a method) returns ``loss / K``; its caller divides the result
by K once more (``loss = compute_loss(...); (loss / K).backward()``): each micro-batch's
gradient is scaled 1/K², so the window's gradient is G / K. With SGD every update is K times
too small; with Adam the difference hides in epsilon and clipping, but it is not the
large-batch update. The Accelerate form (the helper divides, ``accelerator.backward`` divides
by its own K again) is AG121 (:mod:`.accelerate`), which follows the same helpers.

Judged only when everything is in sight: one definition of the helper's name in the file;
every ``return`` of it a division by K (``return loss / K``, or a name whose only value is
one: ``loss = crit(...) / K`` or an unconditional ``loss /= K``); K named as the accumulation
steps (``grad_accum_steps``, ``self.accumulation_steps``, ``args.gradient_accumulation_steps``,
or an alias of one), not a size or a count (``micro_batch_size``, ``n_tokens``); the caller's
second division by such a K of the helper's result (directly, or through the one name that
holds it) reaching a ``.backward()`` of the same function. A helper dividing by anything else
(a token count, the world size) is not judged.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import ACCUM_RE, FUNCS, dotted, last_part, walk_local
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.loss import _division, _flows_to_backward

__all__ = ["k_dividing_helpers", "k_helper_result", "loss_divided_by_k_twice"]

#: K-like names that are sizes or counts, not the number of micro-steps
_NOT_K = re.compile(r"bs$|_bs|size|tok|count|len|items|sample|numel|denom|norm")
_CASTS = ("int", "float")


def is_k(ctx: FileContext, expr: ast.AST) -> bool:
    """``expr`` names the number of accumulation steps: its last identifier looks like K
    (and not like a size or count), or it is a name whose one assignment in the file is an
    alias of such a name (``K = args.grad_accum_steps``)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in _CASTS \
            and len(expr.args) == 1:
        expr = expr.args[0]
    d = dotted(expr)
    if d is None or not isinstance(expr, ast.Name | ast.Attribute):
        return False
    last = last_part(d)
    if ACCUM_RE.search(last):
        return not _NOT_K.search(last)
    if isinstance(expr, ast.Name):
        values = [v for names, v in ctx.assignments() if names == [d]]
        return len(values) == 1 and isinstance(values[0], ast.Name | ast.Attribute) and is_k(ctx, values[0])
    return False


def _k_division(ctx: FileContext, expr: ast.AST | None) -> bool:
    return isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) and is_k(ctx, expr.right)


def _returns_k_division(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST | None:
    """The division by K every ``return`` of ``fn`` hands back (the first one), else None."""
    returns = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Return)]
    if not returns:
        return None
    found: list[ast.AST] = []
    for ret in returns:
        value = ret.value
        if _k_division(ctx, value):
            assert value is not None
            found.append(value)
            continue
        if not isinstance(value, ast.Name):
            return None
        writes = [n for n in ctx.local_nodes(fn)
                  if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
                  and any(isinstance(t, ast.Name) and t.id == value.id
                          for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
        divs = [w for w in writes if isinstance(w, ast.AugAssign) and isinstance(w.op, ast.Div)]
        if len(divs) == 1 and divs[0] in fn.body and is_k(ctx, divs[0].value):
            found.append(divs[0])  # `loss /= K` on the function's own level: always applied
        elif len(writes) == 1 and isinstance(writes[0], ast.Assign) and _k_division(ctx, writes[0].value):
            found.append(writes[0].value)
        else:
            return None
    return found[0]


def k_dividing_helpers(ctx: FileContext) -> dict[str, tuple[ast.AST, ast.AST]]:
    """Functions/methods of the file (one definition of the name) whose every return is a
    division by K: name -> (definition, division)."""
    def compute() -> dict[str, tuple[ast.AST, ast.AST]]:
        defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for fn in ctx.of(*FUNCS):
            defs.setdefault(fn.name, []).append(fn)
        out: dict[str, tuple[ast.AST, ast.AST]] = {}
        for name, fns in defs.items():
            if len(fns) == 1 and (div := _returns_k_division(ctx, fns[0])) is not None:
                out[name] = (fns[0], div)
        return out
    return ctx._cached("k_dividing_helpers", ctx.tree, compute)  # type: ignore[no-any-return]


def k_helper_result(ctx: FileContext, expr: ast.AST, scope: ast.AST) -> str | None:
    """The helper's name when ``expr`` is a call of a K-dividing helper (``f(...)``,
    ``self.f(...)``), or a name whose last value before ``expr`` in the same block is one."""
    helpers = k_dividing_helpers(ctx)
    if isinstance(expr, ast.Call):
        d = dotted(expr.func) or ""
        name = d.rsplit(".", 1)[-1]
        if name in helpers and (d == name or d.count(".") == 1):
            return name
        return None
    if not isinstance(expr, ast.Name):
        return None
    stmt = ctx.parents.get(expr)
    while stmt is not None and not isinstance(stmt, ast.stmt):
        stmt = ctx.parents.get(stmt)
    block = ctx.parents.get(stmt) if stmt is not None else None
    body = next((getattr(block, f) for f in ("body", "orelse", "finalbody")
                 if isinstance(getattr(block, f, None), list) and stmt in getattr(block, f)), None)
    if body is None:
        return None
    before = body[: body.index(stmt)]
    for prior in reversed(before):
        if any(isinstance(n, ast.Name) and n.id == expr.id and isinstance(n.ctx, ast.Store)
               for n in walk_local(prior)):
            if isinstance(prior, ast.Assign) and len(prior.targets) == 1 \
                    and isinstance(prior.targets[0], ast.Name) and prior.targets[0].id == expr.id:
                return k_helper_result(ctx, prior.value, scope)
            return None
    return None


@rule("AG133")
def loss_divided_by_k_twice(ctx: FileContext) -> Iterator[Finding]:
    if not k_dividing_helpers(ctx):
        return
    for node in ctx.of(ast.BinOp, ast.AugAssign):
        d = _division(node)
        if d is None or not is_k(ctx, d[1]):
            continue
        scope = ctx.scope_of(node)
        helper = k_helper_result(ctx, d[0], scope)
        if helper is None or not _flows_to_backward(ctx, node):
            continue
        fn, div = k_dividing_helpers(ctx)[helper]
        if fn is scope or any(node is n for n in ctx.local_nodes(fn)):
            continue
        yield ctx.finding(
            "AG133",
            node,
            f"`{ast.unparse(node)}` divides by the accumulation steps a loss that `{helper}()` "
            f"already divided by them (`{ast.unparse(div)}`, line {getattr(div, 'lineno', '?')}): "
            "each micro-batch's gradient is scaled 1/K² and the optimizer receives G / K",
        )
