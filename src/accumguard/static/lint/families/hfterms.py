"""AG142 (LOSS_SCALE): a Hugging Face Trainer loss (a ``compute_loss`` override, or the
function given as ``compute_loss_func``) that adds, beside a term normalised by
``num_items_in_batch``, a term that is a mean of its own micro-batch and is divided by
nothing.

``num_items_in_batch`` counts the whole accumulation window's tokens, so the normalised term
is the window's token mean and the Trainer does not divide the loss by K (transformers 5:
``compute_loss_func`` given, or the model taking loss kwargs). A micro-batch mean added at
full weight (a z-loss, an activation or router regulariser: ``coef * x.mean()``) is then
summed over the K micro-batches: it weighs K times its coefficient next to the main term
(the large batch's loss is the main token mean plus coef times the mean over the whole
window). Proven from the source: the mean is a ``.mean()`` (or ``torch.mean``) at the top of
the term, inline, through a name the function assigns, or as the return of a function of the
file, or a transformers MoE model's ``outputs.aux_loss`` (its router load-balancing loss
over the micro-batch's tokens); no division applies to the term outside the mean; the file does not set
``loss_is_scaled_for_ga = False``. An error when ``gradient_accumulation_steps`` is in sight
and above 1, a warning when it is not in sight, nothing when it is 1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import is_mean_call, mean_loss_site
from accumguard.static.lint.families._modguard import k_values
from accumguard.static.lint.families.hfscale import _reaching, _uses_num_items, _window_normalised

__all__ = ["hf_compute_loss_func_ignores_num_items", "hf_loss_term_not_divided_by_k"]

_Func = ast.FunctionDef | ast.AsyncFunctionDef


def _loss_functions(ctx: FileContext) -> list[_Func]:
    """``compute_loss`` overrides, and the functions handed to ``compute_loss_func=``."""
    out: list[_Func] = [fn for _, fn in ctx.trainer_compute_losses()]
    return list(dict.fromkeys(out + _compute_loss_funcs(ctx)))


def _compute_loss_funcs(ctx: FileContext) -> list[_Func]:
    """The functions handed to ``compute_loss_func=`` (by name, or the inner function a
    factory of the file returns)."""
    out: list[_Func] = []
    defs: dict[str, list[_Func]] = {}
    for f in ctx.of(*FUNCS):
        defs.setdefault(f.name, []).append(f)
    for call in ctx.of(ast.Call):
        for kw in call.keywords:
            if kw.arg != "compute_loss_func":
                continue
            value = kw.value
            if isinstance(value, ast.Name) and len(defs.get(value.id, [])) == 1:
                out.append(defs[value.id][0])
            elif isinstance(value, ast.Call) and len(defs.get(call_attr(value) or "", [])) == 1:
                factory = defs[call_attr(value) or ""][0]
                returned = {r.value.id for r in ast.walk(factory)
                            if isinstance(r, ast.Return) and isinstance(r.value, ast.Name)}
                out += [f for f in factory.body if isinstance(f, FUNCS) and f.name in returned]
    return list(dict.fromkeys(out))


def _returned_losses(ctx: FileContext, fn: _Func) -> list[ast.AST]:
    """The loss expressions ``fn`` returns (``(loss, outputs) if return_outputs else loss``:
    the loss), a returned name replaced by the value it holds there."""
    out: list[ast.AST] = []
    for ret in (n for n in ctx.local_nodes(fn) if isinstance(n, ast.Return) and n.value is not None):
        stack: list[ast.AST] = [ret.value] if ret.value is not None else []
        while stack:
            e = stack.pop()
            if isinstance(e, ast.IfExp):
                stack += [e.body, e.orelse]
            elif isinstance(e, ast.Tuple) and e.elts:
                stack.append(e.elts[0])
            elif isinstance(e, ast.Name):
                value = _reaching(ctx, fn, e.id, ret)
                if value is not None:
                    out.append(value)
            else:
                out.append(e)
    return out


def _terms(ctx: FileContext, fn: _Func, expr: ast.AST, at: ast.AST, depth: int = 2) -> list[ast.AST]:
    """The additive terms of ``expr`` (a name holding a sum is split too; a subtracted term
    is a term: ``ce - beta * entropy``)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add | ast.Sub):
        return _terms(ctx, fn, expr.left, at, depth) + _terms(ctx, fn, expr.right, at, depth)
    if isinstance(expr, ast.Name) and depth > 0:
        value = _reaching(ctx, fn, expr.id, at)
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add | ast.Sub):
            return _terms(ctx, fn, value, at, depth - 1)
    return [expr]


#: torch loss functions whose default ``reduction`` averages over the micro-batch
def _micro_mean(ctx: FileContext, fn: _Func, term: ast.AST, at: ast.AST) -> ast.AST | None:
    """The mean a term is, times constants or coefficients and nothing divided: the mean
    call (inline, through a name ``fn`` assigns, or a file function returning one), else
    None."""
    defs = {f.name: f for f in ctx.of(*FUNCS)}
    stack, found = [term], None
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            stack += [e.left, e.right]
        elif isinstance(e, ast.BinOp) and _coefficient(e):
            continue  # a coefficient (``self.temperature ** 2``, ``1.0 - self.args.alpha``)
        elif _masked_micro_mean(ctx, fn, e):
            found = e
        elif isinstance(e, (ast.BinOp, ast.UnaryOp)):
            return None  # a division (or anything else) outside the mean
        elif is_mean_call(e) or _moe_aux(e):
            found = e
        elif isinstance(e, ast.Name):
            value = _reaching(ctx, fn, e.id, at)
            if value is not None and _micro_mean(ctx, fn, value, at) is not None:
                found = e
        elif isinstance(e, ast.Call) and (call_attr(e) or "") in defs:
            body = defs[call_attr(e) or ""]
            rets = [r.value for r in ast.walk(body) if isinstance(r, ast.Return) and r.value is not None]
            if rets and all(_mean_times_constants(r) for r in rets):
                found = e
    return found


def _masked_micro_mean(ctx: FileContext, fn: _Func, e: ast.AST) -> bool:
    """``total / mask.sum()`` (or ``torch.sum(mask)``, ``.clamp(min=1)`` after it): a sum over
    this micro-batch's tokens divided by this micro-batch's count of them, the mask a name
    ``fn`` makes (not ``num_items_in_batch``, nothing all-reduced)."""
    if not (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div)):
        return False
    d = e.right
    while isinstance(d, ast.Call) and call_attr(d) in ("clamp", "clamp_min", "float", "clip") \
            and isinstance(d.func, ast.Attribute):
        d = d.func.value
    if isinstance(d, ast.Name) and _helper_count(ctx, fn, d.id):
        return True
    mask = _summed_name(d)
    if mask is None or "num_items" in mask.id:
        return False
    assigned = any(isinstance(n, ast.Name) and n.id == mask.id and isinstance(n.ctx, ast.Store)
                   for n in ast.walk(fn))
    return assigned and mask.id not in ctx.all_reduced_names(fn)


def _helper_count(ctx: FileContext, fn: _Func, name: str) -> bool:
    """``name`` is unpacked, in ``fn``, from a call of a function of the file whose every
    return puts there a sum of a mask of the tokens it was given (``return (kl * mask).sum(),
    mask.sum()`` with ``mask = labels.ne(-100)``): this micro-batch's count, nothing
    all-reduced."""
    defs = ctx.defs_by_name()
    for a in ast.walk(fn):
        if not (isinstance(a, ast.Assign) and len(a.targets) == 1
                and isinstance(a.targets[0], ast.Tuple) and isinstance(a.value, ast.Call)):
            continue
        names = [e.id if isinstance(e, ast.Name) else None for e in a.targets[0].elts]
        helpers = defs.get(call_attr(a.value) or "", [])
        if name not in names or len(helpers) != 1:
            continue
        i = names.index(name)
        rets = [r.value for r in ast.walk(helpers[0]) if isinstance(r, ast.Return)]
        counts = [r.elts[i] for r in rets if isinstance(r, ast.Tuple) and len(r.elts) == len(names)]
        if counts and len(counts) == len(rets) and all(
                _mask_sum(helpers[0], c) for c in counts) \
                and not ctx.all_reduced_names(helpers[0]):
            return True
    return False


def _summed_name(e: ast.AST) -> ast.Name | None:
    """The name ``e`` sums whole: ``mask.sum()`` or ``torch.sum(mask)``."""
    if not (isinstance(e, ast.Call) and call_attr(e) == "sum" and not e.keywords):
        return None
    mask = e.args[0] if dotted(e.func) == "torch.sum" and len(e.args) == 1 else (
        e.func.value if isinstance(e.func, ast.Attribute) and not e.args else None)
    return mask if isinstance(mask, ast.Name) else None


def _mask_sum(helper: _Func, e: ast.AST) -> bool:
    """``mask.sum()`` (or ``torch.sum(mask)``) of a name ``helper`` assigns from a comparison
    (``labels.ne(-100)``, ``labels != pad``)."""
    mask = _summed_name(e)
    return mask is not None and any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == mask.id
                                                 for t in a.targets)
               and any(isinstance(n, ast.Compare) or call_attr(n) in ("ne", "eq", "gt", "ge",
                                                                       "lt", "le")
                       for n in ast.walk(a.value) if isinstance(n, ast.Compare | ast.Call))
               for a in ast.walk(helper))


def _coefficient(e: ast.AST) -> bool:
    """Numbers and names combined by ``+``, ``-``, ``*`` or ``**`` (``1.0 - alpha``,
    ``self.temperature ** 2``): a coefficient, nothing divided and no call."""
    if isinstance(e, ast.Constant | ast.Name | ast.Attribute):
        return True
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        return _coefficient(e.operand)
    return isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add | ast.Sub | ast.Mult | ast.Pow) \
        and _coefficient(e.left) and _coefficient(e.right)


def _moe_aux(e: ast.AST) -> bool:
    """``outputs.aux_loss`` (``outputs["aux_loss"]``): a transformers Mixture-of-Experts
    model's router load-balancing loss, a statistic of the micro-batch's tokens."""
    if isinstance(e, ast.Attribute):
        return e.attr == "aux_loss"
    return (isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant)
            and e.slice.value == "aux_loss")


def _mean_times_constants(e: ast.AST) -> bool:
    """A mean call times numbers or names (``F.kl_div(...) * T * T``), nothing divided."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
        sides = [e.left, e.right]
        means = [x for x in sides if _mean_times_constants(x)]
        return len(means) == 1 and all(
            isinstance(x, ast.Constant | ast.Name | ast.Attribute) for x in sides if x not in means)
    return is_mean_call(e)


def _scaled_for_ga_false(ctx: FileContext) -> bool:
    return any(isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute | ast.Name) and (dotted(t) or "").endswith("loss_is_scaled_for_ga")
        for t in n.targets) and isinstance(n.value, ast.Constant) and n.value.value is False
        for n in ctx.of(ast.Assign))


def _trainer_ks(ctx: FileContext) -> set[int | None]:
    """The ``gradient_accumulation_steps`` given to the file's training-arguments calls."""
    out: set[int | None] = set()
    for call in ctx.of(ast.Call):
        for kw in call.keywords:
            if kw.arg == "gradient_accumulation_steps":
                out |= k_values(ctx, kw.value, call)
    return out


@rule("AG142")
def hf_loss_term_not_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    fns = _loss_functions(ctx)
    if not fns or _scaled_for_ga_false(ctx):
        return
    ks = _trainer_ks(ctx)
    if 1 in ks:
        return
    known = bool(ks) and None not in ks
    for fn in fns:
        ret_at = next((n for n in ctx.local_nodes(fn) if isinstance(n, ast.Return)), fn)
        for loss in _returned_losses(ctx, fn):
            terms = _terms(ctx, fn, loss, ret_at)
            if len(terms) < 2 or not any(_window_normalised(ctx, fn, t) for t in terms):
                continue
            for t in terms:
                if _window_normalised(ctx, fn, t) or _micro_mean(ctx, fn, t, ret_at) is None:
                    continue
                k = next(iter(ks)) if known and len(ks) == 1 else "K"
                f = ctx.finding(
                    "AG142", t,
                    f"the loss term `{ast.unparse(t)}` is a mean of this micro-batch"
                    + (" (a transformers MoE model's router load-balancing loss)"
                       if any(_moe_aux(x) for x in ast.walk(t)) else "")
                    + " added at full weight beside a term normalised by `num_items_in_batch` (the whole "
                    "window's token count, so the Trainer does not divide the loss by "
                    f"gradient_accumulation_steps = {k}): summed over the window it weighs "
                    f"{k}x its coefficient")
                yield f if known else replace(f, severity=Severity.WARNING)
                break


@rule("AG118")
def hf_compute_loss_func_ignores_num_items(ctx: FileContext) -> Iterator[Finding]:
    """The function given as ``compute_loss_func`` returns a per-micro-batch mean and never
    uses ``num_items_in_batch``: transformers 5 counts such a loss as already normalised
    (``loss_is_scaled_for_ga``) and does not divide it by K, so the window's gradient is the
    sum of K micro-batch means: a mean of means, K times the large batch's."""
    ga, how = ctx.trainer_ga()
    if ga == 1 or _scaled_for_ga_false(ctx):
        return
    for fn in _compute_loss_funcs(ctx):
        if _uses_num_items(fn):
            continue
        site = mean_loss_site(ctx, fn, None)
        if site is None:
            continue
        node, what = site
        f = ctx.finding(
            "AG118", node,
            f"`{fn.name}`, the Trainer's compute_loss_func, returns a per-micro-batch mean "
            f"({what}) and never uses `num_items_in_batch`, with "
            f"{how if ga else 'gradient accumulation possibly on (its value is not in sight)'}: "
            "transformers 5 counts a compute_loss_func's loss as already normalised and does not "
            "divide it by K, so the window's gradient is the sum of K micro-batch means (a mean "
            "of means, and K times the large batch's gradient); expected the summed loss divided "
            "by `num_items_in_batch`")
        yield f if ga is not None else replace(f, severity=Severity.WARNING)
