"""The accumulated gradient all-reduced after every backward (F10): AG154.

``Tensor.register_post_accumulate_grad_hook(hook)`` runs ``hook(param)`` once the
backward has added its gradient into ``param.grad``: with K backwards per optimizer step,
``param.grad`` there is the window's running sum. A hook that all-reduces ``param.grad``
with SUM therefore sums the earlier micro-batches over the ranks again at every backward:
the i-th micro-batch of a window reaches the optimizer multiplied by W^(K-i), and only the
last one is reduced once. (AVG, or a division by W in the hook, keeps it right: the running
sum is then the same on every rank and averaging it again changes nothing.) Reduce the
incoming gradient instead (``register_hook`` on the tensor, whose argument is the
micro-batch's own gradient), or once per window after the last backward.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_HOOK = "register_post_accumulate_grad_hook"


def _hook_functions(ctx: FileContext) -> Iterator[tuple[ast.Call, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda]]:
    for call in ctx.of(ast.Call):
        if call_attr(call) != _HOOK or not call.args:
            continue
        arg = call.args[0]
        if isinstance(arg, ast.Lambda):
            yield call, arg
            continue
        fn = ctx.function_named(arg, call)
        if fn is not None:
            yield call, fn


def _sums(call: ast.Call) -> bool:
    op = next((k.value for k in call.keywords if k.arg == "op"), call.args[1] if len(call.args) > 1 else None)
    return op is None or last_part(dotted(op)).lower() == "sum"


@rule("AG154")
def accumulated_grad_reduced_per_backward(ctx: FileContext) -> Iterator[Finding]:
    if not any(ctx.window_facts(w).accumulating for w in ctx.windows()):
        return
    for reg, fn in _hook_functions(ctx):
        params = fn.args.args
        if params and params[0].arg == "self" and isinstance(ctx.parents.get(fn), ast.ClassDef):
            params = params[1:]  # a method handed as ``self._hook``: its first argument is self
        if not params:
            continue
        param = params[0].arg
        body = list(walk_all(fn))
        if any(isinstance(n, ast.If | ast.IfExp) for n in body):
            continue  # gated (a sync flag, the last micro-step): not every backward
        if any(isinstance(n, ast.Call) and call_attr(n) in ("div_", "mul_") and n.args
               and ctx.mentions_world(n.args[0]) for n in body) or any(
                isinstance(n, ast.AugAssign) and ctx.mentions_world(n.value) for n in body):
            continue
        for n in body:
            if (isinstance(n, ast.Call) and call_attr(n) == "all_reduce" and n.args and _sums(n)
                    and dotted(n.args[0]) in (f"{param}.grad", f"{param}.grad.data")):
                yield ctx.finding(
                    "AG154",
                    n,
                    f"`{ast.unparse(n)}` in a hook registered with `{_HOOK}` (line {reg.lineno}) "
                    f"sums `{param}.grad`, the window's running sum, over the ranks after every "
                    "backward: with K backwards per step the earlier micro-batches are summed again "
                    "each time, so the i-th reaches the optimizer multiplied by W^(K-i)",
                )


def _of_grads(ctx: FileContext, place: ast.AST, expr: ast.AST, depth: int = 3) -> bool:
    """``expr`` is a parameter's ``.grad`` or a tensor the function builds from ``.grad``
    (``buf = torch.cat([g.reshape(-1) for g in grads])`` with ``grads = [p.grad for p in
    params]``), a few assignments deep."""
    if any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in walk_all(expr)):
        return True
    if depth == 0:
        return False
    names = {n.id for n in walk_all(expr) if isinstance(n, ast.Name)}
    return any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in a.targets)
               and _of_grads(ctx, place, a.value, depth - 1) for a in ctx.local_nodes(place))


def _gated(ctx: FileContext, node: ast.AST, place: ast.AST) -> bool:
    cur = ctx.parents.get(node)
    while cur is not None and cur is not place:
        if isinstance(cur, ast.If | ast.IfExp):
            return True
        cur = ctx.parents.get(cur)
    return False


def _averages(ctx: FileContext, place: ast.AST) -> bool:
    """``place`` divides by the world size (``g.div_(world)``, ``buf /= W``, ``/ W``)."""
    for n in ctx.local_nodes(place):
        if isinstance(n, ast.Call) and call_attr(n) in ("div_", "mul_") and n.args and ctx.mentions_world(n.args[0]):
            return True
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div | ast.Mult) and ctx.mentions_world(n.value):
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and ctx.mentions_world(n.right):
            return True
    return False


def _instance_methods(ctx: FileContext, window: ast.AST) -> dict[ast.AST, ast.Call]:
    """Methods the window calls on an object of a class of the file built in the same
    function (``reducer = GradReducer(...)`` then ``reducer.reduce()``)."""
    scope = ctx.scope_of(window)

    def compute() -> dict[str, ast.ClassDef]:  # once per scope, not per window
        classes = {c.name: c for c in ctx.of(ast.ClassDef)}
        out: dict[str, ast.ClassDef] = {}
        if not classes:
            return out
        for a in ctx.local_nodes(scope):
            if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) \
                    and isinstance(a.value, ast.Call) and isinstance(a.value.func, ast.Name) \
                    and a.value.func.id in classes:
                out[a.targets[0].id] = classes[a.value.func.id]
        return out
    built: dict[str, ast.ClassDef] = ctx._cached("hookreduce_built", scope, compute)
    if not built:
        return {}
    out: dict[ast.AST, ast.Call] = {}
    for c in ctx.local_nodes(window):
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) \
                and isinstance(c.func.value, ast.Name) and c.func.value.id in built:
            cls = built[c.func.value.id]
            for f in cls.body:
                if isinstance(f, FUNCS) and f.name == c.func.attr:
                    out.setdefault(f, c)
    return out


@rule("AG154")
def accumulated_grad_reduced_per_micro_step(ctx: FileContext) -> Iterator[Finding]:
    """The loop form: a SUM all-reduce of the gradients, ungated, in the window's micro-step
    loop (inline or in a function it runs), with no division by the world size there, while
    the window accumulates."""
    seen: set[int] = set()
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or not isinstance(window, ast.For | ast.AsyncFor | ast.While):
            continue
        methods = _instance_methods(ctx, window)
        for place in (window, *ctx.reached(window), *methods):
            if _averages(ctx, place):
                continue
            for n in ctx.local_nodes(place):
                if not (isinstance(n, ast.Call) and call_attr(n) == "all_reduce" and n.args and _sums(n)) \
                        or id(n) in seen or _gated(ctx, n, place) or ctx.guarded(n, window) \
                        or not _of_grads(ctx, place, n.args[0]):
                    continue
                seen.add(id(n))
                site = methods.get(place)
                via = (f" (in `{getattr(place, 'name', '?')}()`, run from line {site.lineno})"
                       if site is not None else ctx.via_text(n, window))
                yield ctx.finding(
                    "AG154",
                    n,
                    f"`{ast.unparse(n)}`{via} sums the gradients over the ranks on every "
                    "micro-step of the window while they accumulate in `.grad`: each call sums "
                    "the window's running total again, so the earlier micro-batches are counted "
                    "W times more at every later micro-step; no division by the world size "
                    "follows there",
                )
