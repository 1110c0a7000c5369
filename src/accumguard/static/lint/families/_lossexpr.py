"""What a loss expression is and what divides it: the facts the loss-normalisation rules
(loss.py, scale.py, accelerate.py, hfscale.py, hfterms.py, twice.py, tailscale.py,
factored.py) all ask of a division or a loss call.

* :func:`division` / :func:`is_loss_division`: ``a / b`` and ``a /= b`` whose dividend is a
  loss or whose result lands in a loss name;
* :func:`flows_to_backward`: the division is part of what is back-propagated (here, or
  returned by a helper whose call is);
* :func:`is_count`: the divisor counts this micro-batch's (or this rank's) tokens or samples;
* :func:`mean_loss_site`: where a function computes a per-micro-batch mean loss (a
  mean-reducing call or module, the model's ``outputs.loss``, a ``.mean()``).
"""

from __future__ import annotations

import ast
import re

from accumguard.static.lint._ast import (
    ACCUM_RE,
    FUNCS,
    GLOBAL_COUNT_RE,
    WORLD_RE,
    call_attr,
    dotted,
    identifiers,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint.families._masked import counts_tokens, masked_mean

__all__ = ["all_reduced", "assigned_names", "divides_by_k", "division", "flows_to_backward", "is_count", "is_loss",
           "is_loss_division", "is_mean_call", "mean_criteria", "mean_loss_site", "reduction", "returned_by_call", "unpacked",
           "value_through"]


_GLOBAL_ONLY = re.compile(r"global|all_?reduce|world")


def division(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(dividend, divisor) of ``a / b`` or ``a /= b``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return node.left, node.right
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
        return node.target, node.value
    return None


def is_loss(expr: ast.AST) -> bool:
    return any("loss" in i or i in ("cross_entropy", "nll") for i in identifiers(expr))


def is_loss_division(ctx: FileContext, node: ast.AST, dividend: ast.AST) -> bool:
    """The dividend is a loss, the result is stored under a loss name (``loss = crit(...) / W``),
    or it is back-propagated as it stands (``(summed / n).backward()``)."""
    return (is_loss(dividend) or any("loss" in n.lower() for n in assigned_names(ctx, node))
            or _in_backward_call(ctx, node))


def assigned_names(ctx: FileContext, node: ast.AST) -> set[str]:
    """The names a division's result lands in (``loss = x / W`` -> {loss})."""
    if isinstance(node, ast.AugAssign):
        d = dotted(node.target)
        return {d} if d else set()
    cur = ctx.parents.get(node)
    while isinstance(cur, ast.BinOp | ast.UnaryOp | ast.Call | ast.Attribute):
        cur = ctx.parents.get(cur)
    if isinstance(cur, ast.Assign):
        return {d for d in (dotted(t) for t in cur.targets) if d}
    if isinstance(cur, ast.AnnAssign | ast.AugAssign):
        d = dotted(cur.target)
        return {d} if d else set()
    return set()


def flows_to_backward(ctx: FileContext, node: ast.AST, depth: int = 0, *, through_returns: bool = False) -> bool:
    """Is the division part of the loss that is back-propagated: in its own function, or (with
    ``through_returns``) returned by a function of the file (``def compute_loss(...): return
    loss / W``) whose call is back-propagated where it is called (two calls deep)?"""
    if _flows_here(ctx, node):
        return True
    fn = ctx.enclosing(node, FUNCS)
    if (not through_returns or depth >= 2 or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            or not _returned(ctx, fn, node)):
        return False
    return any(flows_to_backward(ctx, site, depth + 1, through_returns=True) for site in ctx.call_sites(fn))


def _returned(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef, node: ast.AST) -> bool:
    """``node`` is (part of) what ``fn`` returns: inside its ``return`` expression, or
    assigned to a name a later ``return`` gives back."""
    cur = ctx.parents.get(node)
    while cur is not None and cur is not fn:
        if isinstance(cur, ast.Return):
            return True
        cur = ctx.parents.get(cur)
    names = assigned_names(ctx, node)
    line = getattr(node, "lineno", 0)
    return any(isinstance(n, ast.Return) and n.value is not None and n.lineno > line
               and dotted(n.value) in names for n in ctx.local_nodes(fn))


def _in_backward_call(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` is inside a backward call's loss: ``(loss / W).backward()``."""
    scope = ctx.scope_of(node)
    backwards = ctx.backward_losses(scope)
    calls = ctx._cached("backward_ids", scope, lambda: {id(call) for call, _ in backwards})
    cur = ctx.parents.get(node)
    while cur is not None and cur is not scope:
        if id(cur) in calls:
            return True
        cur = ctx.parents.get(cur)
    return False


def _flows_here(ctx: FileContext, node: ast.AST) -> bool:
    if _in_backward_call(ctx, node):
        return True
    scope = ctx.scope_of(node)
    backwards = ctx.backward_losses(scope)
    targets = assigned_names(ctx, node)
    if not targets:
        return False
    line = getattr(node, "lineno", 0)
    by_name = ctx._cached("backward_by_name", scope, lambda: _index_by_name(backwards))
    return any(call.lineno >= line for t in targets for call in by_name.get(t, ()))


def _index_by_name(backwards: list[tuple[ast.Call, set[str]]]) -> dict[str, list[ast.Call]]:
    out: dict[str, list[ast.Call]] = {}
    for call, src in backwards:
        for name in src:
            out.setdefault(name, []).append(call)
    return out


def _count_names(ctx: FileContext) -> set[str]:
    """Names assigned from a count (``n_local = sum(int(b["mask"].sum()) for b in window)``)."""
    def compute() -> set[str]:
        out: set[str] = set()
        for node in ctx.of(ast.Assign, ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None or len(targets) != 1 or not (d := dotted(targets[0])):
                continue
            if not isinstance(node.value, ast.Call | ast.BinOp | ast.Subscript | ast.Attribute | ast.Name):
                continue
            value = _returned_by_helper(ctx, node.value) or node.value
            if counts_tokens(value) and not ctx.mentions_world(value):
                out.add(d)
        return out
    return ctx._cached("count_names", ctx.tree, compute)  # type: ignore[no-any-return]


def _returned_by_helper(ctx: FileContext, value: ast.AST) -> ast.AST | None:
    """What ``helper(...)`` returns when the file's one function of that name has one
    ``return`` (``denom = window_loss_scale(window)`` with ``return float(tokens_in(window))``)."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return None
    defs = ctx.functions_by_name().get(value.func.id, [])
    if len(defs) != 1:
        return None
    rets = [r.value for r in ast.walk(defs[0]) if isinstance(r, ast.Return) and r.value is not None]
    return rets[0] if len(rets) == 1 else None


def is_count(ctx: FileContext, divisor: ast.AST, *, micro_batch: bool = True) -> bool:
    """``n_tokens``, ``mask.sum()``, ``(labels != -100).sum()``, or a name assigned from such a
    count: a count of this micro-batch (``micro_batch``: names saying window/total/global are
    not) or of this rank (only names saying global are not; whether it was all-reduced is
    checked by the caller)."""
    ids = list(identifiers(divisor))
    scope_re = GLOBAL_COUNT_RE if micro_batch else _GLOBAL_ONLY
    if any(WORLD_RE.search(i) or ACCUM_RE.search(i) or scope_re.search(i) for i in ids):
        return False
    if counts_tokens(divisor):
        return True
    if micro_batch:
        return False  # a name computed elsewhere may be the window's count: no guess
    names = {d for d in (dotted(s) for s in walk_all(divisor)) if d}
    return bool(names & _count_names(ctx))


#: functional losses whose default reduction is a mean over this micro-batch's elements
MEAN_LOSS_FUNCS = frozenset(
    {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
     "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss"}
)


_LOSS_CLASS = re.compile(r"Loss$")


def _is_loss_class(func: ast.AST) -> bool:
    """``nn.CrossEntropyLoss``, ``torch.nn.MSELoss``, ``CrossEntropyLoss``: a loss module class."""
    return bool(_LOSS_CLASS.search((dotted(func) or "").rsplit(".", 1)[-1]))


def reduction(call: ast.Call) -> str | None:
    """The ``reduction=`` a loss call or constructor was given ("mean" when absent), or None
    when it is computed."""
    kw = next((k.value for k in call.keywords if k.arg == "reduction"), None)
    if kw is None:
        return "mean"
    return kw.value if isinstance(kw, ast.Constant) and isinstance(kw.value, str) else None


def mean_criteria(ctx: FileContext) -> set[str]:
    """Names assigned a mean-reducing loss module: ``self.loss_fct = nn.CrossEntropyLoss()``."""
    def compute() -> set[str]:
        out: set[str] = set()
        for names, value in ctx.assignments():
            if (
                isinstance(value, ast.Call)
                and _is_loss_class(value.func)
                and reduction(value) == "mean"
                and len(names) == 1
            ):
                out.add(names[0])
        return out
    return ctx._cached("mean_criteria", ctx.tree, compute)  # type: ignore[no-any-return]


def _class_criteria(cls: ast.ClassDef) -> set[str]:
    """``self.X`` names that the class itself makes a mean-reducing loss module: a class
    attribute ``X = nn.CrossEntropyLoss()`` or ``self.X = nn.CrossEntropyLoss()`` in one of
    its methods, and no other assignment of ``self.X`` in the class (a sum-reducing module
    or a factory's result keeps it out)."""
    mean: set[str] = set()
    other: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = f"self.{stmt.targets[0].id}"
            is_mean = (isinstance(stmt.value, ast.Call) and _is_loss_class(stmt.value.func)
                       and reduction(stmt.value) == "mean")
            (mean if is_mean else other).add(name)
    for n in walk_all(cls):
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            name = dotted(n.targets[0]) or ""
            if not name.startswith("self.") or name.count(".") != 1:
                continue
            is_mean = (isinstance(n.value, ast.Call) and _is_loss_class(n.value.func)
                       and reduction(n.value) == "mean")
            (mean if is_mean else other).add(name)
    return mean - other


def mean_loss_site(ctx: FileContext, fn: ast.AST, cls: ast.ClassDef | None = None, depth: int = 2
                    ) -> tuple[ast.AST, str] | None:
    """Where ``fn`` computes a per-micro-batch mean loss, and how it reads: a mean-reducing
    loss call, a mean-reducing loss module, the model's own ``outputs.loss`` (computed
    without ``num_items_in_batch``: a mean over this micro-batch's tokens), a ``.mean()``.
    With ``cls``, a ``self.X`` module is judged by the class's own assignments only
    (another class's ``self.loss_fct`` is another object)."""
    criteria = mean_criteria(ctx)
    if cls is not None:
        criteria = {c for c in criteria if not c.startswith("self.")} | _class_criteria(cls)
    for n in ctx.local_nodes(fn):
        if isinstance(n, ast.Call):
            name = call_attr(n) or ""
            if name in MEAN_LOSS_FUNCS and reduction(n) == "mean":
                return n, f"`{ast.unparse(n.func)}(...)` with reduction='mean'"
            if isinstance(n.func, ast.Call) and _is_loss_class(n.func.func) and reduction(n.func) == "mean":
                return n, f"`{ast.unparse(n.func.func)}()` with reduction='mean'"
            if (d := dotted(n.func)) is not None and d in criteria:
                return n, f"`{d}`, a mean-reducing loss module"
            if name == "mean" and not n.args and is_loss(n.func):
                return n, f"`{ast.unparse(n)}`"
            if depth > 0 and (inner := _helper_mean(ctx, n, depth)) is not None:
                return n, f"`{ast.unparse(n.func)}(...)`, a function of this file returning {inner}"
        elif (div := division(n)) is not None and is_count(ctx, unpacked(ctx, fn, div[1])) and (
            is_loss(top := unpacked(ctx, fn, div[0])) or _summed(ctx, top)):
            return n, f"`{ast.unparse(n)}`, divided by this micro-batch's own count"
        elif (div := division(n)) is not None and _rows_of(div[1]) and _summed(ctx, div[0]):
            return n, f"`{ast.unparse(n)}`, a sum over this micro-batch's rows divided by their number"
        elif (
            isinstance(n, ast.Attribute) and n.attr == "loss" and isinstance(n.ctx, ast.Load)
            and dotted(n.value) != "self"
        ) or (
            isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
            and isinstance(n.slice, ast.Constant) and n.slice.value == "loss"
        ):
            return n, f"`{ast.unparse(n)}`, the model's mean over this micro-batch's tokens"
    return None


def _rows_of(divisor: ast.AST) -> bool:
    """``t.numel()``, ``t.size(0)``, ``t.shape[0]``, ``len(t)`` of a tensor of the batch
    (``target``, ``batch["labels"]``): the micro-batch's own number of rows, not a count a
    name says is of the window, the ranks or K."""
    if isinstance(divisor, ast.Call) and isinstance(divisor.func, ast.Name) \
            and divisor.func.id == "len" and len(divisor.args) == 1:
        of: ast.AST | None = divisor.args[0]
    elif isinstance(divisor, ast.Call) and call_attr(divisor) in ("numel", "size") and (
            call_attr(divisor) == "numel" and not divisor.args
            or len(divisor.args) == 1 and isinstance(divisor.args[0], ast.Constant)
            and divisor.args[0].value == 0):
        of = receiver(divisor)
    elif isinstance(divisor, ast.Subscript) and isinstance(divisor.slice, ast.Constant) \
            and divisor.slice.value == 0 and isinstance(divisor.value, ast.Attribute) \
            and divisor.value.attr == "shape":
        of = divisor.value.value
    else:
        return False
    if not isinstance(of, ast.Name | ast.Subscript | ast.Attribute):
        return False
    ids = list(identifiers(of))
    return not any(WORLD_RE.search(i) or ACCUM_RE.search(i) or GLOBAL_COUNT_RE.search(i)
                   for i in ids)


def _summed(ctx: FileContext, expr: ast.AST) -> bool:
    """``expr`` sums something (a ``.sum()``), directly or through the names its function
    assigns once (``return ce + coef * z, n`` with ``ce = F.cross_entropy(...,
    reduction="sum")`` and ``z = (...).sum()``)."""
    def sums(e: ast.AST) -> bool:
        return any(isinstance(x, ast.Call) and (call_attr(x) == "sum" or reduction(x) == "sum")
                   for x in walk_all(e))
    if sums(expr):
        return True
    fn = ctx.enclosing(expr, FUNCS)
    if fn is None:
        return False
    names = {x.id for x in walk_all(expr) if isinstance(x, ast.Name)}
    values = [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) and len(a.targets) == 1
              and isinstance(a.targets[0], ast.Name) and a.targets[0].id in names]
    return bool(values) and any(sums(v) for v in values)


def _helper_mean(ctx: FileContext, call: ast.Call, depth: int) -> str | None:
    """How a module-level function of the file that ``call`` runs computes a per-micro-batch
    mean loss (a loss call whose ``reduction=`` parameter this call sets to "mean", or any
    mean :func:`mean_loss_site` reads in its body), or None."""
    if not isinstance(call.func, ast.Name):
        return None
    defs = ctx.functions_by_name().get(call.func.id, [])
    if len(defs) != 1 or not isinstance(ctx.parents.get(defs[0]), ast.Module):
        return None
    helper = defs[0]
    params = {a.arg: d for a, d in zip(reversed(helper.args.args), reversed(helper.args.defaults), strict=False)}
    for n in ctx.local_nodes(helper):
        kw = next((k.value for k in getattr(n, "keywords", ()) if k.arg == "reduction"), None)
        if not (isinstance(n, ast.Call) and (call_attr(n) or "") in MEAN_LOSS_FUNCS
                and isinstance(kw, ast.Name)):
            continue
        given = bound_argument(helper, call, kw.id) or params.get(kw.id)
        if isinstance(given, ast.Constant) and given.value == "mean":
            return f"`{ast.unparse(n.func)}(...)` with reduction='mean'"
    inner = mean_loss_site(ctx, helper, None, depth - 1)
    return None if inner is None else inner[1]


#: torch loss functions whose default reduction averages their micro-batch
_LOSS_MEANS = frozenset({"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
                         "huber_loss", "binary_cross_entropy",
                         "binary_cross_entropy_with_logits", "kl_div"})


def is_mean_call(e: ast.AST) -> bool:
    """``x.mean()`` or ``torch.mean(x)`` over every element (no ``dim``), or a torch loss
    function averaging its micro-batch (``F.kl_div(..., reduction="batchmean")``,
    ``F.mse_loss(a, b)``)."""
    if isinstance(e, ast.Call) and call_attr(e) in _LOSS_MEANS:
        how = next((k.value for k in e.keywords if k.arg == "reduction"), None)
        return how is None or (isinstance(how, ast.Constant) and how.value in ("mean", "batchmean"))
    if not isinstance(e, ast.Call) or call_attr(e) != "mean" or e.keywords:
        return False
    if isinstance(e.func, ast.Attribute) and dotted(e.func.value) in ("torch",):
        return len(e.args) == 1
    return not e.args


def returned_by_call(ctx: FileContext, w: ast.Assign, name: str
              ) -> tuple[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef, ast.Return] | None:
    """``loss`` of ``loss = f(...)`` or ``loss, ce = self.f(...)`` where ``f`` is the one
    function of the file by that name and has one ``return``: what it returns there (the
    matching element of a tuple), the function, and that return."""
    target, call = w.targets[0], w.value
    if not isinstance(call, ast.Call):
        return None
    if isinstance(target, ast.Tuple):
        ids = [dotted(e) for e in target.elts]
        if ids.count(name) != 1:
            return None
        i: int | None = ids.index(name)
    elif dotted(target) == name:
        i = None
    else:
        return None
    fns = ctx.functions_by_name().get(call_attr(call) or "", [])
    if len(fns) != 1:
        return None
    rets = [r for r in ast.walk(fns[0]) if isinstance(r, ast.Return) and r.value is not None
            and ctx.enclosing(r, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) is fns[0]]
    if len(rets) != 1:
        return None
    value = rets[0].value
    if i is None:
        return None if isinstance(value, ast.Tuple) else (value, fns[0], rets[0])  # type: ignore[return-value]
    if not (isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts)):  # type: ignore[attr-defined]
        return None
    return value.elts[i], fns[0], rets[0]


def unpacked(ctx: FileContext, fn: ast.AST, expr: ast.AST) -> ast.AST:
    """What a name of ``fn`` holds when ``fn`` binds it once from a call of a function of the
    file (``ce_sum, n_tok = token_ce_sum(model, batch)`` with ``return
    F.cross_entropy(..., reduction="sum"), (tgt != -100).sum()``): what that function returns
    for it (:func:`returned_by_call`); a clamp of it (``n_tok.clamp(min=1)``) reads
    through. Else ``expr`` itself."""
    inner = expr
    if isinstance(inner, ast.Call) and call_attr(inner) in ("clamp", "clamp_min", "clip") \
            and isinstance(inner.func, ast.Attribute):
        inner = inner.func.value
    if not isinstance(inner, ast.Name):
        return expr
    binds = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and any(isinstance(x, ast.Name) and x.id == inner.id for x in walk_all(n.targets[0]))]
    got = returned_by_call(ctx, binds[0], inner.id) if len(binds) == 1 else None
    return got[0] if got is not None else expr


_NORMALISED_BY_COUNT = ("token", "num_items", "n_items", "count", "n_valid", "num_valid", "denom", "normali")


def all_reduced(ctx: FileContext, node: ast.AST, divisor: ast.AST) -> bool:
    """The divisor is (built from) a name all-reduced in the division's scope or the file: a
    count over the window's micro-steps and every rank, neither K nor this micro-batch's own
    count (a name derived from the micro-batch list is not K once it was all-reduced)."""
    names = {d for d in (dotted(s) for s in walk_all(divisor)) if d}
    return bool(names & (ctx.all_reduced_names(ctx.scope_of(node)) | ctx.all_reduced_names(ctx.tree)))


def divides_by_k(ctx: FileContext, window: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """Divisions of a loss by the accumulation steps in ``window``: (node, dividend)."""
    out = []
    for sub in ctx.local_nodes(window):
        d = division(sub)
        if d is None or all_reduced(ctx, sub, d[1]) or masked_mean(ctx, window, sub, set(), helpers=False):
            continue  # (x * mb.mask).sum() / mb.mask.sum() is a token mean, not a division by K
        if isinstance(d[1], ast.IfExp) and not (ctx.mentions_accum(d[1].body) and ctx.mentions_accum(d[1].orelse)):
            continue  # ``/ (tail if in_tail else K)``: K on some micro-steps only
        if _rebound_in_branch(ctx, window, d[1]):
            continue  # ``if i >= last_start: accum = last_accum`` in the loop: K not on every window
        ids = list(identifiers(d[1]))
        if not (ctx.mentions_accum(d[1]) or _len_of_window(window, d[1])) \
                or any(n in i for i in ids for n in _NORMALISED_BY_COUNT) \
                or is_count(ctx, d[1], micro_batch=False):
            continue  # (``ntok = sum((y != -100).sum() for _, y in micro)``: tokens, not K)
        if is_loss_division(ctx, sub, d[0]):
            out.append((sub, d[0]))
    return out


def _rebound_in_branch(ctx: FileContext, window: ast.AST, divisor: ast.AST) -> bool:
    """The divisor is a name the window rebinds under an ``if`` (timm's tail:
    ``if batch_idx >= last_batch_idx_to_accum: accum_steps = last_accum_steps``)."""
    if not isinstance(divisor, ast.Name):
        return False
    for sub in ctx.local_nodes(window):
        if isinstance(sub, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == divisor.id for t in sub.targets):
            cur = ctx.parents.get(sub)
            while cur is not None and cur is not window:
                if isinstance(cur, ast.If):
                    return True
                cur = ctx.parents.get(cur)
    return False


def _len_of_window(window: ast.AST, divisor: ast.AST) -> bool:
    """``len(window)`` for a window loop ``for mb in window:`` (or over ``enumerate(window)``),
    or ``N`` for ``for k in range(N):``: the number of its micro-batches, K, whatever the
    name."""
    if not isinstance(window, ast.For | ast.AsyncFor):
        return False
    it = window.iter
    if isinstance(it, ast.Call) and dotted(it.func) == "enumerate" and it.args:
        it = it.args[0]  # ``for j, mb in enumerate(window):``
    if isinstance(it, ast.Call) and dotted(it.func) == "range" and len(it.args) == 1 \
            and not it.keywords and isinstance(divisor, ast.Name | ast.Attribute) \
            and ast.dump(divisor) == ast.dump(it.args[0]):
        return True
    return (isinstance(divisor, ast.Call)
            and dotted(divisor.func) == "len" and len(divisor.args) == 1
            and ast.dump(divisor.args[0]) == ast.dump(it))


#: methods that keep a count's value (a floor against 0, a host read, a cast)
_KEEPS_VALUE = frozenset({"clamp", "clamp_min", "clamp_", "item", "float", "to", "detach",
                          "double"})


def value_through(ctx: FileContext, at: ast.AST, expr: ast.AST) -> ast.AST:
    """``expr`` through what keeps its value: ``(n / W).clamp(min=1.0)``, and a plain name
    bound once in the function around ``at`` (``denom = (n / W).clamp(min=1)``)."""
    for _ in range(4):
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in _KEEPS_VALUE:
            expr = expr.func.value
        elif isinstance(expr, ast.Name):
            values = ctx.assigned_in(ctx.scope_of(at)).get(expr.id, [])
            if len(values) != 1:
                return expr
            expr = values[0]
        else:
            return expr
    return expr
