"""Masked token means: a loss summed over a mask and divided by that mask's own count.

``(per_token * mask).sum() / mask.sum()`` (GRPO/PPO token losses, hand-written LM
losses) is a mean over *this* micro-batch's valid tokens, whatever the names are: the
divisor is the sum of an expression that also weighs the summed dividend. The same
normaliser written once in a helper (``def masked_mean(x, m): return (x * m).sum() /
m.sum()``) and called in the window is the same mean. Read by AG104 (the mean divided by
K: a mean of means) and AG129 (the mean not divided by K at all: K x the gradient). Also
the hints that a mean-reduced loss averages a variable number of tokens
(:func:`token_mean_hints`: ``ignore_index``, a mask, -100 in the scope).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from accumguard.static.lint._ast import (
    ACCUM_RE,
    COUNT_RE,
    FUNCS,
    GLOBAL_COUNT_RE,
    WORLD_RE,
    call_attr,
    dotted,
    identifiers,
    last_part,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.families._maskrows import mean_over_masked_rows
from accumguard.static.lint.families.deepspeed import _name_values

__all__ = ["counted_mean", "counted_per_micro_batch", "counts_tokens", "counts_window", "counts_window_slice", "forward_token_mean", "helper_called", "hf_loss", "masked_mean", "masked_mean_helpers", "masks_labels", "micro_batch_count",
           "num_items_arg", "sized_slice", "through_names", "token_mean_hints", "window_normalised"]

#: wrappers that keep a count a count: ``m.sum().clamp(min=1)``, ``.float()``, ``max(n, 1)``
_COUNT_WRAPPERS = frozenset({"clamp", "clamp_min", "clip", "float", "to", "type_as", "detach", "item"})
_SUM_CALLS = frozenset({"sum", "nansum"})
_COUNT_CALLS = frozenset({"sum", "count_nonzero", "numel", "nonzero"})


def _summed_operand(expr: ast.AST) -> ast.AST | None:
    """``Y`` of a count ``Y.sum(...)`` / ``torch.sum(Y)`` (through clamp/float/max(., 1))."""
    while isinstance(expr, ast.Call):
        name = (call_attr(expr) or "") if isinstance(expr.func, ast.Attribute) else (dotted(expr.func) or "")
        if isinstance(expr.func, ast.Attribute) and name in _COUNT_WRAPPERS:
            expr = expr.func.value
        elif name in {"max", "torch.max", "torch.clamp", "torch.clamp_min"} and expr.args:
            expr = expr.args[0]
        elif name in _SUM_CALLS and isinstance(expr.func, ast.Attribute):
            return expr.func.value
        elif name in {"torch.sum", "torch.nansum"} and expr.args:
            return expr.args[0]
        else:
            return None
    return None


def _sums_weighted_by(dividend: ast.AST, weight: ast.AST) -> bool:
    """``dividend`` sums something and ``weight`` (the count's operand) appears in what it
    sums: ``(x * m).sum()``, ``torch.sum(x * m, -1)``, ``(x * m).sum(-1)``."""
    want = ast.dump(weight)
    for sub in walk_all(dividend):
        if not isinstance(sub, ast.Call):
            continue
        name = (call_attr(sub) or "") if isinstance(sub.func, ast.Attribute) else (dotted(sub.func) or "")
        inner = receiver(sub) if isinstance(sub.func, ast.Attribute) else (sub.args[0] if sub.args else None)
        if name.split(".")[-1] in _SUM_CALLS and inner is not None and any(
            ast.dump(n) == want for n in walk_all(inner)
        ):
            return True
    return False


def _is_masked_division(expr: ast.AST, *, rows: bool = True) -> bool:
    """``(x * m).sum() / m.sum()``; with ``rows`` also a mean per row, its count summed along
    a dimension (``(x * m).sum(1) / m.sum(1)``: one mean per sequence)."""
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div)):
        return False
    weight = _summed_operand(expr.right)
    if weight is None or not _sums_weighted_by(expr.left, weight):
        return False
    return rows or not _along_a_dimension(expr.right)


def _along_a_dimension(count: ast.AST) -> bool:
    """The count is summed along a dimension (``m.sum(1)``, ``m.sum(dim=-1)``,
    ``torch.sum(m, -1)``): a count per row, not the micro-batch's."""
    for sub in walk_all(count):
        if isinstance(sub, ast.Call) and (call_attr(sub) or dotted(sub.func) or "").split(".")[-1] \
                in _COUNT_CALLS:
            method = isinstance(sub.func, ast.Attribute) and dotted(sub.func.value) != "torch"
            if len(sub.args) > (0 if method else 1) or any(k.arg in ("dim", "axis")
                                                           for k in sub.keywords):
                return True
    return False


def helper_called(call: ast.AST) -> str | None:
    """The name of the file's function a call reaches: ``f(...)`` or a method ``self.f(...)``."""
    if not isinstance(call, ast.Call):
        return None
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id in {
            "self", "cls"}:
        return call.func.attr
    return None


def masked_mean_helpers(ctx: FileContext, *, rows: bool = True) -> set[str]:
    """Functions defined once in the file whose every ``return`` is a masked token mean
    (``rows``: or per-row masked means)."""
    def compute() -> set[str]:
        defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
            defs.setdefault(fn.name, []).append(fn)
        out: set[str] = set()
        for name, fns in defs.items():
            if len(fns) != 1:
                continue  # a name defined twice is not followed
            rets = [n for n in ctx.local_nodes(fns[0]) if isinstance(n, ast.Return)]
            if rets and all(r.value is not None and masked_mean(
                    ctx, fns[0], r.value, set(), helpers=False, rows=rows) for r in rets):
                out.add(name)
        return out
    return ctx._cached(f"masked_mean_helpers:{rows}", ctx.tree, compute)  # type: ignore[no-any-return]


def masked_mean(ctx: FileContext, scope: ast.AST, expr: ast.AST, seen: set[str], *,
                helpers: bool = True, rows: bool = True) -> bool:
    """``expr`` is a masked mean over this micro-batch's tokens: the division itself, its
    negation, a local name every assignment of which is one, or a call of a helper that
    returns one; with ``rows`` (a mean per micro-batch, whatever its unit: AG129's K x) also
    ``.mean()`` of per-sequence masked means. Without it (AG104's mean of token means) a
    mean of per-sequence means is not one: its unit is the sequence, and with as many
    sequences in every micro-batch, / K is the large batch's mean over them."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return masked_mean(ctx, scope, expr.operand, seen, helpers=helpers, rows=rows)
    if _is_masked_division(expr, rows=rows):
        return True
    if isinstance(expr, ast.Name):
        return _every_value(ctx, scope, expr, seen,
                            lambda v: masked_mean(ctx, scope, v, seen, helpers=helpers, rows=rows))
    if isinstance(expr, ast.Call):
        if isinstance(expr.func, ast.Attribute) and expr.func.attr == "mean" and not expr.args and not expr.keywords:
            return masked_mean(ctx, scope, expr.func.value, seen, helpers=helpers, rows=rows)
        if helpers and helper_called(expr) is not None:
            return helper_called(expr) in masked_mean_helpers(ctx, rows=rows)
    return False


def _every_value(ctx: FileContext, scope: ast.AST, name: ast.Name, seen: set[str],
                 test: Callable[[ast.AST], bool]) -> bool:
    """Every value the scope assigns to ``name`` passes ``test`` (a name never rewritten in
    place, seen once per search: ``seen`` breaks cycles)."""
    if name.id in seen:
        return False
    seen.add(name.id)
    values, rewritten = _name_values(ctx, scope)
    vals = values.get(name.id, [])
    return name.id not in rewritten and bool(vals) and all(test(v) for v in vals)


def hf_loss(ctx: FileContext, scope: ast.AST, expr: ast.AST, seen: set[str] | None = None) -> bool:
    """``expr`` is a model output's ``.loss`` (``out.loss``, ``model(**b).loss``, a name
    every assignment of which is one) computed without ``num_items_in_batch``: the model's
    own mean over this micro-batch's label tokens (those not -100)."""
    seen = set() if seen is None else seen
    if isinstance(expr, ast.Name):
        # `loss = out.loss` then `loss = loss / K`: the scaled value is the same loss
        values, rewritten = _name_values(ctx, scope)
        vals = [v for v in values.get(expr.id, []) if not (
            isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div | ast.Mult)
            and isinstance(v.left, ast.Name) and v.left.id == expr.id)]
        if expr.id in seen or expr.id in rewritten or not vals:
            return False
        seen.add(expr.id)
        return all(hf_loss(ctx, scope, v, seen) for v in vals)
    if not (isinstance(expr, ast.Attribute) and expr.attr == "loss"):
        return False
    out = expr.value
    calls = [out] if isinstance(out, ast.Call) else (
        _name_values(ctx, scope)[0].get(out.id, []) if isinstance(out, ast.Name) else [])
    return bool(calls) and all(isinstance(c, ast.Call) and not any(
        k.arg == "num_items_in_batch" for k in c.keywords) for c in calls)


def forward_token_mean(ctx: FileContext, scope: ast.AST, expr: ast.AST) -> bool:
    """``expr`` is the loss a module of the file returns from ``forward`` (``logits, loss =
    model(X, Y)``, nanoGPT's shape), computed there as a mean ``cross_entropy``/``nll_loss``
    with an ``ignore_index``: a mean over this micro-batch's valid tokens."""
    if not isinstance(expr, ast.Name):
        return False
    spots = [(n, i) for n in ast.walk(scope) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Call)
             for i, e in enumerate(n.targets[0].elts) if isinstance(e, ast.Name) and e.id == expr.id]
    if len(spots) != 1:
        return False
    assign, index = spots[0]
    width = len(assign.targets[0].elts)  # type: ignore[attr-defined]
    forwards = [f for f in ctx.functions_by_name().get("forward", [])
                if isinstance(ctx.parents.get(f), ast.ClassDef)]
    shaped = [f for f in forwards if any(
        isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and len(r.value.elts) == width
        for r in ast.walk(f))]
    if len(shaped) != 1:
        return False
    ignored = _returned_token_mean(shaped[0], index, width)
    return ignored is not None and _writes_value(ctx, ignored)


def _returned_token_mean(fn: ast.AST, index: int, width: int) -> object | None:
    """The ``ignore_index`` value of the mean loss call whose result ``fn`` returns at
    ``index`` of a tuple of ``width``, or None."""
    means: dict[str, object] = {}
    for n in ast.walk(fn):
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and call_attr(n.value) in ("cross_entropy", "nll_loss")):
            continue
        kws = {k.arg: k.value for k in n.value.keywords}
        how = kws.get("reduction")
        value = _number(kws.get("ignore_index"))
        if value is None or not (how is None or (isinstance(how, ast.Constant) and how.value == "mean")):
            continue
        means.update({t.id: value for t in n.targets if isinstance(t, ast.Name)})
    rets = [r.value.elts[index] for r in ast.walk(fn) if isinstance(r, ast.Return)
            and isinstance(r.value, ast.Tuple) and len(r.value.elts) == width]
    return next((means[e.id] for e in rets if isinstance(e, ast.Name) and e.id in means), None)


def _number(e: ast.AST | None) -> object | None:
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant):
        return -e.operand.value if isinstance(e.operand.value, int | float) else None
    return e.value if isinstance(e, ast.Constant) and isinstance(e.value, int | float) else None


def _writes_value(ctx: FileContext, value: object) -> bool:
    """The file writes ``value`` into a tensor (``y.masked_fill(pad, -100)``, ``y[pad] = -1``,
    ``torch.full(..., -100)``, ``F.pad(..., value=-100)``): targets that the loss's
    ``ignore_index`` skips exist, so its valid count varies. An ``ignore_index`` that no
    target ever takes (nanoGPT's -1 over equal-length batches) says nothing."""
    for n in ctx.of(ast.Call, ast.Assign):
        if isinstance(n, ast.Assign):
            if any(isinstance(t, ast.Subscript) for t in n.targets) and _number(n.value) == value:
                return True
        elif call_attr(n) in ("masked_fill", "masked_fill_", "full", "full_like", "pad", "where",
                              "fill_", "new_full") and any(
                _number(a) == value for a in [*n.args, *(k.value for k in n.keywords)]):
            return True
    return False


_NUM_ITEMS = "num_items_in_batch"


def num_items_arg(call: ast.AST) -> ast.expr | None:
    """The ``num_items_in_batch=`` keyword of a call (a HF model, loss function or
    ``compute_loss``): the loss it returns is the summed loss divided by that count."""
    if isinstance(call, ast.Call):
        return next((k.value for k in call.keywords if k.arg == _NUM_ITEMS), None)
    return None


def counted_per_micro_batch(ctx: FileContext, scope: ast.AST, window: ast.AST, count: ast.AST) -> bool:
    """The count handed as ``num_items_in_batch`` is computed inside the window: it reads a
    name the window assigns (its loop variable, ``batch = next(it)``, ``n = (b["labels"] !=
    -100).sum()``), so it is the micro-batch's own count and the loss a per-micro-batch mean
    again. A count built only from names assigned outside the window's body (before the
    inner loop, a parameter, a field, ``n.item()`` of such a name) counts the window."""
    def compute() -> set[str]:
        out: set[str] = set()
        for n in ctx.local_nodes(window):
            targets = n.targets if isinstance(n, ast.Assign) else (
                [n.target] if isinstance(n, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor) else [])
            out.update(x.id for t in targets for x in walk_all(t) if isinstance(x, ast.Name))
        if isinstance(window, ast.For | ast.AsyncFor):
            out.update(x.id for x in walk_all(window.target) if isinstance(x, ast.Name))
        return out
    assigned: set[str] = ctx._cached("num_items_window_names", window, compute)
    if isinstance(count, ast.Name) and _sums_a_window_slice(ctx, window, count.id):
        return False
    if _counts_a_window_span(ctx, window, count):
        return False
    return any(isinstance(x, ast.Name) and x.id in assigned for x in walk_all(count))


def _counts_a_window_span(ctx: FileContext, window: ast.AST, count: ast.AST) -> bool:
    """The count reads a slice whose length is a multiple of K (``labels[s * K * W * m:(s +
    1) * K * W * m]``): the whole window's items, read at each micro-step; directly or
    through the one value the window gives its name."""
    exprs = [count]
    if isinstance(count, ast.Name):
        exprs += [n.value for n in ctx.local_nodes(window) if isinstance(n, ast.Assign)
                  and len(n.targets) == 1 and dotted(n.targets[0]) == count.id]
    return sized_slice(ctx, ctx.enclosing(count, FUNCS), exprs, ctx.mentions_accum)


def sized_slice(ctx: FileContext, fn: ast.AST | None, exprs: list[ast.AST],
                sized_by: Callable[[ast.AST], bool]) -> bool:
    """Some expression of ``exprs`` reads a slice both of whose bounds ``sized_by`` accepts,
    directly or through a name ``fn`` assigns from such a value (``lo, hi = s * K * W * m,
    (s + 1) * K * W * m``, tuples paired)."""
    def sized(bound: ast.AST) -> bool:
        if sized_by(bound):
            return True
        if not (isinstance(bound, ast.Name) and fn is not None):
            return False
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and len(n.targets) == 1:
                t, v = n.targets[0], n.value
                pairs = (list(zip(t.elts, v.elts, strict=True)) if isinstance(t, ast.Tuple)
                         and isinstance(v, ast.Tuple) and len(t.elts) == len(v.elts) else [(t, v)])
                if any(isinstance(x, ast.Name) and x.id == bound.id and sized_by(y) for x, y in pairs):
                    return True
        return False
    return any(isinstance(sl, ast.Slice) and sl.lower is not None and sl.upper is not None
               and sized(sl.lower) and sized(sl.upper)
               for e in exprs for sl in walk_all(e))


def _sums_a_window_slice(ctx: FileContext, window: ast.AST, name: str) -> bool:
    """``name`` is assigned once in the window, from a comprehension over ``items[a:a + K]``
    (K the accumulation count): the count of the window the micro-batch belongs to, made at
    each micro-step (``num_items = sum(... for b in batches[w0:w0 + K])``)."""
    values = [n.value for n in ctx.local_nodes(window) if isinstance(n, ast.Assign)
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
              and n.targets[0].id == name]
    if len(values) != 1:
        return False
    for comp in walk_all(values[0]):
        if not isinstance(comp, ast.GeneratorExp | ast.ListComp | ast.SetComp):
            continue
        for gen in comp.generators:
            sl = gen.iter.slice if isinstance(gen.iter, ast.Subscript) else None
            if (isinstance(sl, ast.Slice) and sl.lower is not None
                    and isinstance(sl.upper, ast.BinOp) and isinstance(sl.upper.op, ast.Add)
                    and ast.dump(sl.upper.left) == ast.dump(sl.lower)
                    and ctx.mentions_accum(sl.upper.right)):
                return True
    return False


def window_normalised(ctx: FileContext, scope: ast.AST, window: ast.AST, expr: ast.AST) -> bool:
    """``expr`` is a model output's ``.loss`` (or a name of one) from a call given
    ``num_items_in_batch=`` a count of the whole window: the window's normalisation."""
    if isinstance(expr, ast.Name):
        vals = _name_values(ctx, scope)[0].get(expr.id, [])
        return bool(vals) and all(window_normalised(ctx, scope, window, v) for v in vals)
    if not (isinstance(expr, ast.Attribute) and expr.attr == "loss"):
        return False
    out = expr.value
    calls = [out] if isinstance(out, ast.Call) else (
        _name_values(ctx, scope)[0].get(out.id, []) if isinstance(out, ast.Name) else [])
    counts = [num_items_arg(c) for c in calls]
    return bool(counts) and all(c is not None and not counted_per_micro_batch(ctx, scope, window, c)
                                for c in counts)


_COMPARE_METHODS = frozenset({"ne", "eq", "gt", "ge", "lt", "le", "not_equal", "greater"})


def counts_tokens(expr: ast.AST) -> bool:
    """``expr`` computes a count: a count-like name (``n_tokens``, ``mask``), a string key
    (``b["mask"]``), ``.sum()`` of a comparison (``(labels != -100).sum()``), or the sum of
    per-sequence lengths (``lengths.sum()``, ``b["seq_lens"].sum()``, ``sum(lengths)``)."""
    if any(COUNT_RE.search(i) for i in identifiers(expr)):
        return True
    for sub in walk_all(expr):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and COUNT_RE.search(sub.value.lower()):
            return True
        if isinstance(sub, ast.Call) and call_attr(sub) in _COUNT_CALLS:
            recv = receiver(sub)
            if recv is not None and any(
                    isinstance(n, ast.Compare)
                    or (isinstance(n, ast.Call) and call_attr(n) in _COMPARE_METHODS)
                    for n in walk_all(recv)):
                return True  # (`(y != -100).sum()`, `y.ne(-100).sum()`)
        summed = _summed(sub)
        if summed is not None and _names_lengths(summed):
            return True
    return False


_LENGTHS_RE = re.compile(r"^(seq_?|token_?|tok_?|input_?|response_?|resp_?)?(len|lens|lengths?)$")


def _summed(node: ast.AST) -> ast.AST | None:
    """``X`` of ``X.sum()``, ``torch.sum(X)`` or ``sum(X)``."""
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr == "sum":
        return node.func.value
    if dotted(node.func) in ("sum", "torch.sum") and node.args:
        return node.args[0]
    return None


def _names_lengths(expr: ast.AST) -> bool:
    """``lengths``, ``b.seq_lens``, ``batch["response_lengths"]``: per-sequence token lengths."""
    last = (expr.slice.value if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant)
            else last_part(dotted(expr)))
    return isinstance(last, str) and _LENGTHS_RE.match(last.lower()) is not None


def count_expr(expr: ast.AST) -> bool:
    """A token count that does not say it covers the window, every rank or K."""
    if any(WORLD_RE.search(i) or ACCUM_RE.search(i) or GLOBAL_COUNT_RE.search(i) for i in identifiers(expr)):
        return False
    return counts_tokens(expr)


def micro_batch_count(ctx: FileContext, scope: ast.AST, window: ast.AST, divisor: ast.AST) -> bool:
    """``divisor`` counts this micro-batch's tokens: a count (:func:`counts_tokens`:
    ``mask.sum()``, ``(labels != -100).sum()``, ``lengths.sum()``), or a name the window
    assigns only from counts, that reads a name the window assigns on each micro-step
    (:func:`counted_per_micro_batch`: a window's count made before its micro-steps is not)."""
    if isinstance(divisor, ast.Name):
        values = [n.value for n in ctx.local_nodes(window) if isinstance(n, ast.Assign)
                  and len(n.targets) == 1 and dotted(n.targets[0]) == divisor.id]
        counted = count_expr(divisor) or (bool(values) and all(count_expr(v) for v in values))
    else:
        counted = count_expr(divisor)
    return counted and counted_per_micro_batch(ctx, scope, window, divisor)


def summed_loss(expr: ast.AST) -> bool:
    """``expr`` sums: a ``.sum()``/``torch.sum(...)``, or a loss call with ``reduction="sum"``."""
    return any(isinstance(n, ast.Call) and (
        _summed(n) is not None
        or any(k.arg == "reduction" and isinstance(k.value, ast.Constant) and k.value.value == "sum"
               for k in n.keywords)) for n in walk_all(expr))


def counted_mean(ctx: FileContext, scope: ast.AST, window: ast.AST, expr: ast.AST, seen: set[str]) -> bool:
    """``expr`` is a sum over this micro-batch's tokens divided by this micro-batch's own
    count (:func:`micro_batch_count`): ``tok_sum / (labels != -100).sum()``,
    ``(logp * mask).sum() / lengths.sum()``; through its negation and local names."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return counted_mean(ctx, scope, window, expr.operand, seen)
    if isinstance(expr, ast.Name):
        return _every_value(ctx, scope, expr, seen, lambda v: counted_mean(ctx, scope, window, v, seen))
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div)):
        return False
    left = expr.left
    summed = summed_loss(left) or (isinstance(left, ast.Name) and _every_value(
        ctx, scope, left, set(), summed_loss))  # `tok = F.cross_entropy(..., reduction="sum")`
    return summed and micro_batch_count(ctx, scope, window, expr.right)


def counts_window(ctx: FileContext, divisor: ast.AST) -> bool:
    """The count is built over several batches by a comprehension that counts
    (``sum((y != -100).sum() for _, y in window)``,
    ``torch.stack([... for _, lab in window]).sum()``): directly, through the names it is
    assigned from in the same function (``n = accelerator.gather(n).sum()``), or as what a
    function of the file returns (``n = self.global_tokens(window)``). The window's count,
    not one micro-batch's."""
    func = ctx.enclosing(divisor, FUNCS)
    if func is None:
        return False
    return _built_over_batches(ctx, func, [divisor], depth=2)


def counts_window_slice(ctx: FileContext, divisor: ast.AST) -> bool:
    """The count is a sum over a slice of the data sized by K, both bounds (``m[lo:lo + per_window]
    .sum()`` with ``per_window = K * W * mb``, directly or through names the function assigns
    from such arithmetic): the window's count, made from data every rank holds whole."""
    fn: ast.AST | None = ctx.enclosing(divisor, FUNCS) or ctx.tree
    exprs: list[ast.AST] = [divisor]
    if isinstance(divisor, ast.Name) and fn is not None:
        exprs += [v for v in ctx.assigned_in(fn).get(divisor.id, [])
                  if isinstance(v, ast.Call) and call_attr(v) in ("sum", "count_nonzero")]
    elif not (isinstance(divisor, ast.Call) and call_attr(divisor) in ("sum", "count_nonzero")):
        return False

    return sized_slice(ctx, fn, exprs[1:] if isinstance(divisor, ast.Name) else exprs,
                       through_names(ctx, fn, ctx.sized_by_accum))


def through_names(ctx: FileContext, fn: ast.AST | None,
                  sized_by: Callable[[ast.AST], bool]) -> Callable[[ast.AST], bool]:
    """``sized_by``, also accepting an expression with a name that ``fn`` assigns from a value
    ``sized_by`` accepts (``lo + per_window`` with ``per_window = K * W * m``)."""
    def sized(e: ast.AST) -> bool:
        return sized_by(e) or (fn is not None and any(
            isinstance(n, ast.Name) and any(sized_by(v) for v in ctx.assigned_in(fn).get(n.id, []))
            for n in walk_all(e)))
    return sized


def _counts_items(elt: ast.AST) -> bool:
    """A comprehension's element counts something: valid tokens (``(y != -100).sum()``,
    a count-like name) or a size (``len(b)``, ``x.numel()``, ``x.size(0)``)."""
    return counts_tokens(elt) or any(
        isinstance(c, ast.Call) and call_attr(c) in ("len", "numel", "size") for c in walk_all(elt))


def _built_over_batches(ctx: FileContext, func: ast.AST, exprs: list[ast.expr | ast.AST],
                        depth: int) -> bool:
    values: dict[str, list[ast.AST]] = {}
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            values.setdefault(n.targets[0].id, []).append(n.value)
    seen: set[str] = set()
    todo: list[ast.AST] = list(exprs)
    while todo:
        e = todo.pop()
        if any(isinstance(x, ast.GeneratorExp | ast.ListComp) and _counts_items(x.elt)
               for x in ast.walk(e)):
            return True
        for x in walk_all(e):
            if isinstance(x, ast.Name) and x.id not in seen:
                seen.add(x.id)
                todo += values.get(x.id, [])
            elif isinstance(x, ast.Call) and depth > 0:
                defs = ctx.functions_by_name().get(call_attr(x) or "", [])
                rets: list[ast.expr | ast.AST] = [
                    r.value for d in defs[:1] if len(defs) == 1 for r in ast.walk(d)
                    if isinstance(r, ast.Return) and r.value is not None]
                if rets and _built_over_batches(ctx, defs[0], rets, depth - 1):
                    return True
    return False


_TOKEN_MEAN_KEYWORDS = frozenset(
    {"ignore_index", "attention_mask", "loss_mask", "padding_mask", "pad_token_id", "label_mask",
     "labels_mask", "token_mask", "mask"}
)
_TOKEN_MEAN_NAMES = frozenset({"attention_mask", "ignore_index", "loss_mask", "pad_token_id"})


def token_mean_hints(ctx: FileContext, scope: ast.AST) -> tuple[bool, bool]:
    """(token-mean hints in sight, loss summed with reduction='sum') for ``scope``."""
    def compute() -> tuple[bool, bool]:
        hints = summed = False
        for sub in ctx.local_nodes(scope):
            if isinstance(sub, ast.keyword) and sub.arg:
                if sub.arg in _TOKEN_MEAN_KEYWORDS:
                    hints = True
                elif sub.arg == "reduction" and isinstance(sub.value, ast.Constant) and sub.value.value == "sum":
                    summed = True
            elif isinstance(sub, ast.Name | ast.Attribute):
                ident = sub.id if isinstance(sub, ast.Name) else sub.attr
                if ident.lower() in _TOKEN_MEAN_NAMES:
                    hints = True
            elif (isinstance(sub, ast.Call) and mean_over_masked_rows(ctx, scope, sub)) or (
                isinstance(sub, ast.Constant) and sub.value in ("attention_mask", "loss_mask")) or (
                isinstance(sub, ast.UnaryOp)
                and isinstance(sub.op, ast.USub)
                and isinstance(sub.operand, ast.Constant)
                and sub.operand.value == 100
            ):
                hints = True
        return hints, summed
    return ctx._cached("token_hints", scope, compute)  # type: ignore[no-any-return]


def window_sum_names(ctx: FileContext, node: ast.AST) -> set[str]:
    """Names assigned in ``node``'s function from a sum over several micro-batches of a
    ``.sum()`` (``n = sum(b[3].sum() for b in batch)``): a normaliser counted over this
    rank's window, whatever its name says."""
    func = ctx.enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    out: set[str] = set()
    for a in ast.walk(func if func is not None else ctx.tree):
        if not (isinstance(a, ast.Assign) and len(a.targets) == 1
                and isinstance(a.targets[0], ast.Name) and isinstance(a.value, ast.Call)):
            continue
        v = a.value
        if not (isinstance(v.func, ast.Name) and v.func.id == "sum" and len(v.args) == 1
                and isinstance(v.args[0], ast.GeneratorExp | ast.ListComp)):
            continue
        if any(isinstance(c, ast.Call) and call_attr(c) == "sum" and c is not v
               for c in ast.walk(v.args[0].elt)) and not ctx.mentions_world(v):
            out.add(a.targets[0].id)
    return out


def masks_labels(ctx: FileContext) -> bool:
    """The file masks labels out (a ``-100`` literal or an ``ignore_index=`` argument): a
    model's own loss or a cross-entropy is then a mean over a varying number of label tokens
    (an attention mask alone is in every batch of a sequence classifier too)."""
    def compute() -> bool:
        return any((isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)
                    and isinstance(n.operand, ast.Constant) and n.operand.value == 100)
                   or (isinstance(n, ast.keyword) and n.arg == "ignore_index")
                   for n in ast.walk(ctx.tree))
    return bool(ctx._cached("masks_labels", ctx.tree, compute))
