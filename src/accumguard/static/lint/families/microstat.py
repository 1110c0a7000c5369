"""AG147 (MICRO_STAT): values standardised by each micro-batch's own statistics inside an
accumulating window.

Policy-gradient loops whiten their advantages, ``(adv - adv.mean()) / (adv.std() + eps)``.
The large batch whitens the window's advantages with the window's mean and spread. Done
inside the micro-batch loop on a slice of the window, each micro-batch is centred and scaled
by its own statistics instead: the terms of the loss are not the large batch's, whatever
the loss weights (the update differs unless every micro-batch has the same mean and spread).

The source shows it when the centred value is a slice of data that exists before the
micro-batch (the loop's item, or a name the loop assigns from a subscript): the window's
values were there to standardise once. Values made inside the micro-step (rewards of fresh
generations) and anything named for a group (GRPO normalises within one prompt's group, on
purpose) are not judged. Whether the script means per-micro-batch statistics is not in
sight: a warning.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, LOOPS, dotted, position, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["micro_batch_statistics"]

#: helpers that standardise by their argument's own statistics, known by their name
_STANDARDISER = re.compile(r"whiten|standardi[sz]|z_?score|normali[sz]e_?(adv|rew|ret|score)",
                           re.IGNORECASE)
_MEAN = re.compile(r"mean|average|avg", re.IGNORECASE)
_GROUP = re.compile(r"group", re.IGNORECASE)
#: keywords a whole-tensor reduction may carry (none of them picks a dimension)
_WHOLE = frozenset({"keepdim", "unbiased", "correction", "dtype"})


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _mean_of(expr: ast.AST, x: ast.AST) -> bool:
    """``expr`` is the mean of all of ``x``: ``x.mean()``, ``torch.mean(x)``, a helper named
    for a mean whose first argument is ``x`` (``masked_mean(x, mask)``), or ``x.sum() / n``."""
    if isinstance(expr, ast.Call):
        name = dotted(expr.func) or ""
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "mean" \
                and _same(expr.func.value, x) and not expr.args \
                and all(k.arg in _WHOLE for k in expr.keywords):
            return True
        if expr.args and _same(expr.args[0], x) and _MEAN.search(name.rsplit(".", 1)[-1]):
            if name in ("torch.mean", "mean", "np.mean", "numpy.mean"):
                return len(expr.args) == 1 and all(k.arg in _WHOLE for k in expr.keywords)
            return "mean" in name.rsplit(".", 1)[-1].lower() and not any(
                k.arg in ("dim", "axis") for k in expr.keywords)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) \
            and isinstance(expr.left, ast.Call) and isinstance(expr.left.func, ast.Attribute) \
            and expr.left.func.attr == "sum" and not expr.left.args:
        summed = expr.left.func.value  # `x.sum() / n`, or masked: `(x * mask).sum() / n`
        return _same(summed, x) or (isinstance(summed, ast.BinOp)
                                    and isinstance(summed.op, ast.Mult)
                                    and (_same(summed.left, x) or _same(summed.right, x)))
    return False


def _centred(node: ast.AST, values: dict[str, ast.AST] | None = None) -> ast.AST | None:
    """The value ``x`` of ``x - mean(x)`` (the start of a standardisation), else None; the
    mean may be a name assigned in the same function (``mu = (x * m).sum() / n``)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)):
        return None
    right: ast.AST = node.right
    if isinstance(right, ast.Name) and values and right.id in values:
        right = values[right.id]
    return node.left if _mean_of(right, node.left) else None


def _values(ctx: FileContext, scope: ast.AST) -> dict[str, ast.AST]:
    """The value of each name ``scope`` assigns (the last one written), cached."""
    return ctx._cached("microstat_values", scope, lambda: {  # type: ignore[no-any-return]
        name: vals[-1] for name, vals in ctx.assigned_in(scope).items()})


def _standardisers(ctx: FileContext) -> dict[str, int]:
    """Functions of the file that centre one of their parameters by its own mean (or are
    named for whitening): name -> that parameter's position."""
    out: dict[str, int] = {}
    for fn in ctx.of(*FUNCS):
        params = [a.arg for a in fn.args.args]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        if not params:
            continue
        nodes = ctx.local_nodes(fn)
        # only a parameter minus something can centre it: the scope's values are read then
        hit = next((p for n in nodes if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)
                    and isinstance(n.left, ast.Name) and n.left.id in params
                    and _centred(n, _values(ctx, fn)) is n.left
                    for p in [n.left.id]), None)
        if hit is not None:
            out[fn.name] = params.index(hit)
        elif _STANDARDISER.search(fn.name) and any(
                _MEAN.search(dotted(n.func) or "") or (isinstance(n.func, ast.Attribute)
                                                      and n.func.attr in ("std", "var"))
                for n in nodes if isinstance(n, ast.Call)):
            out[fn.name] = 0
    return out


def _root(expr: ast.AST) -> str | None:
    while isinstance(expr, ast.Subscript | ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _loop_targets(window: ast.AST) -> set[str]:
    if isinstance(window, ast.For | ast.AsyncFor):
        return {n.id for n in walk_all(window.target) if isinstance(n, ast.Name)}
    if isinstance(window, FUNCS):  # a framework's per-micro-batch hook: its batch argument
        return {a.arg for a in window.args.args[1:2]} | {
            a.arg for a in window.args.args if a.arg in ("batch", "inputs", "mb", "micro_batch")}
    return set()


def _sliced(value: ast.AST) -> bool:
    """An assigned value that picks part of existing data: a subscript (``adv[i:j]``,
    ``batch["adv"]``) or a comprehension of subscripts (``{k: v[a:b] for ...}``)."""
    if isinstance(value, ast.Subscript):
        return True
    if isinstance(value, ast.DictComp | ast.ListComp | ast.GeneratorExp | ast.SetComp):
        elt = value.value if isinstance(value, ast.DictComp) else value.elt
        return isinstance(elt, ast.Subscript)
    return False


def _per_micro_batch(ctx: FileContext, window: ast.AST, x: ast.AST, depth: int = 2) -> bool:
    """``x`` is part of the micro-batch's data that existed before the micro-step."""
    name = _root(x)
    if name is None or _GROUP.search(ast.unparse(x)):
        return False
    if name in _loop_targets(window):
        return True
    if depth <= 0:
        return False
    line = getattr(x, "lineno", 0)
    before = [n for n in ctx.local_nodes(window) if isinstance(n, ast.Assign)
              and n.lineno < line and any(isinstance(t, ast.Name) and t.id == name
                                          for t in n.targets)]
    if not before:
        return False
    value = max(before, key=position).value  # the assignment the use reads
    if _GROUP.search(ast.unparse(value)):
        return False
    if _sliced(value):
        return True
    if isinstance(value, ast.Subscript | ast.Attribute | ast.Name):
        return _per_micro_batch(ctx, window, value, depth - 1)
    return False


def _accumulates(ctx: FileContext, window: ast.AST) -> bool:
    facts = ctx.window_facts(window)
    return facts.accumulating and not facts.unguarded_optimizer_steps \
        and not ctx.window_k_is_one(window)


@rule("AG147")
def micro_batch_statistics(ctx: FileContext) -> Iterator[Finding]:
    helpers = _standardisers(ctx)
    for window in ctx.windows():
        if not isinstance(window, LOOPS + FUNCS) or not _accumulates(ctx, window):
            continue
        scope = ctx.enclosing(window, FUNCS) if not isinstance(window, FUNCS) else window
        scope = scope if scope is not None else ctx.tree
        for node in ctx.local_nodes(window):
            x: ast.AST | None = None
            how = ""
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in helpers and len(node.args) > helpers[node.func.id]:
                x = node.args[helpers[node.func.id]]
                how = f"`{ast.unparse(node)}` standardises"
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and (
                    c := _centred(node, _values(ctx, scope))) is not None:
                x, how = c, f"`{ast.unparse(node)}` centres"
            if x is None or not _per_micro_batch(ctx, window, x):
                continue
            yield ctx.finding(
                "AG147",
                node,
                f"{how} `{ast.unparse(x)}` by its own statistics inside a window of "
                "several micro-batches: each micro-batch is centred (and scaled) by its own "
                "mean and spread, where the large batch uses the window's, so the loss's "
                "terms are not the large batch's (the update differs unless every "
                "micro-batch has the same statistics). If the algorithm normalises per "
                "group on purpose (one prompt's completions), this is intended",
                fix="standardise the window's values once, before the micro-batch loop (over "
                    "every rank's values when the large batch spans them), and slice the "
                    "result for each micro-batch",
            )
