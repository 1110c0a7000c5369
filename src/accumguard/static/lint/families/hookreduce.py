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
        name = dotted(arg)
        if name is None:
            continue
        if name.startswith("self."):
            cls = ctx.enclosing(call, (ast.ClassDef,))
            hits = [f for f in getattr(cls, "body", []) if isinstance(f, FUNCS) and f.name == name[5:]]
        else:
            hits = ctx.defs_by_name().get(last_part(name), [])
        if len(hits) == 1:
            yield call, hits[0]


def _sums(call: ast.Call) -> bool:
    op = next((k.value for k in call.keywords if k.arg == "op"), call.args[1] if len(call.args) > 1 else None)
    return op is None or last_part(dotted(op)).lower() == "sum"


@rule("AG154")
def accumulated_grad_reduced_per_backward(ctx: FileContext) -> Iterator[Finding]:
    if not any(ctx.window_facts(w).accumulating for w in ctx.windows()):
        return
    for reg, fn in _hook_functions(ctx):
        params = fn.args.args
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
