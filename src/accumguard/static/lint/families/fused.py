"""Optimizer fused into backward (F1): AG137.

``p.register_post_accumulate_grad_hook(hook)`` runs ``hook`` each time a backward has
accumulated ``p``'s gradient. A hook that steps an optimizer (``optims[p].step();
optims[p].zero_grad()``, the "optimizer in backward" recipe) therefore steps on every
backward. When the training loop runs several backwards per optimizer step (an inner
``for _ in range(ACCUM)`` around the backward, a loss divided by an accumulation count, a
``% K`` gate), each micro-batch is stepped on alone: K small steps instead of one.
A hook whose step sits under an ``if`` or after a guard clause (``if not self.sync:
return``: a boundary flag the loop sets) is left alone, and so is a loop with one backward
per step, and an FSDP2 loop that syncs only at the boundary
(``model.set_requires_gradient_sync(last)``: the hooks of FSDP2's sharded parameters fire
when the reduce-scatter writes their gradient, once per window).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, receiver, terminates
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_REGISTRARS = ("register_post_accumulate_grad_hook",)
_NOT_OPTIMIZERS = ("scheduler", "engine", "scaler")


def _hook_bodies(ctx: FileContext, arg: ast.AST) -> list[ast.AST]:
    """The function(s) a hook argument names: ``hook``, ``self.hook``, a ``lambda``,
    ``functools.partial(hook, ...)``. A name defined more than once is not followed."""
    if isinstance(arg, ast.Lambda):
        return [arg]
    if isinstance(arg, ast.Call) and (dotted(arg.func) or "").rsplit(".", 1)[-1] == "partial" and arg.args:
        return _hook_bodies(ctx, arg.args[0])
    name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else None
    if name is None:
        return []
    defs = [f for f in ctx.of(*FUNCS) if f.name == name]
    return defs if len(defs) == 1 else []


def _none_test(test: ast.AST) -> bool:
    """``p.grad is None`` / ``is not None``: a test every backward passes the same way."""
    return (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot | ast.Is)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _conditional(ctx: FileContext, node: ast.AST, hook: ast.AST) -> bool:
    """``node`` sits under an ``if``/``while``/conditional expression inside ``hook``, or
    after a guard clause of it (``if not self.sync: return``), other than a plain ``p.grad
    is not None`` test, which every backward passes."""
    cur = ctx.parents.get(node)
    while cur is not None and cur is not hook:
        if isinstance(cur, ast.If | ast.IfExp | ast.While) and not _none_test(cur.test):
            return True
        cur = ctx.parents.get(cur)
    body = hook.body if isinstance(hook, ast.FunctionDef | ast.AsyncFunctionDef) else []
    line = getattr(node, "lineno", 0)
    return any(isinstance(st, ast.If) and st.lineno < line and terminates(st.body)
               and not _none_test(st.test) for st in body)


def _hook_steps(ctx: FileContext, hook: ast.AST) -> list[ast.Call]:
    body = ast.walk(hook.body) if isinstance(hook, ast.Lambda) else iter(ctx.local_nodes(hook))
    return [
        n for n in body
        if isinstance(n, ast.Call) and call_attr(n) == "step" and receiver(n) is not None
        and ctx.kind_of_receiver(receiver(n)) not in _NOT_OPTIMIZERS and not _conditional(ctx, n, hook)
    ]


def _accumulating_window(ctx: FileContext) -> ast.AST | None:
    """A window that runs several backwards per optimizer step, by its own code (an inner
    ``for _ in range(ACCUM)``, a loss divided by an accumulation count, a ``% K`` gate: a
    name defined elsewhere is not enough), and steps no optimizer itself (the hooks do)."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if (not facts.accumulating or not ctx.window_itself_accumulates(window) or facts.accelerate or facts.summed_loss or facts.engine_backward
                or ctx.window_k_is_one(window)):
            continue
        if any(kind in ("optimizer", "engine") for _, kind in facts.steps):
            continue  # the loop steps an optimizer itself: not the fused recipe
        if _fsdp2_syncs_at_boundary(ctx, window):
            continue
        return window
    return None


def _fsdp2_syncs_at_boundary(ctx: FileContext, window: ast.AST) -> bool:
    """The window sets FSDP2's ``set_requires_gradient_sync(<the boundary test>)``: the
    post-accumulate-grad hooks of FSDP2's sharded parameters fire when the reduce-scatter
    writes their ``.grad``, at the window's last backward only (one step per window)."""
    if not any("fully_shard" in (dotted(c.func) or "") for c in ctx.of(ast.Call)):
        return False
    for part in (window, *ctx.inlined(window)):
        for n in ctx.local_nodes(part):
            if isinstance(n, ast.Call) and call_attr(n) == "set_requires_gradient_sync" \
                    and n.args and ctx.is_boundary_test(n.args[0]):
                return True
    return False


@rule("AG137")
def optimizer_in_backward_accumulating(ctx: FileContext) -> Iterator[Finding]:
    registrations = [c for c in ctx.of(ast.Call) if call_attr(c) in _REGISTRARS and c.args]
    if not registrations:
        return
    window = _accumulating_window(ctx)
    if window is None:
        return
    seen: set[ast.AST] = set()
    for reg in registrations:
        for hook in _hook_bodies(ctx, reg.args[0]):
            for call in _hook_steps(ctx, hook):
                if call in seen:
                    continue
                seen.add(call)
                name = ast.unparse(receiver(call) or call.func)
                yield ctx.finding(
                    "AG137",
                    call,
                    f"`{name}.step()` runs in a post-accumulate-grad hook (registered at line "
                    f"{reg.lineno}), i.e. after every backward, while the loop at line "
                    f"{getattr(window, 'lineno', '?')} accumulates several backwards per optimizer "
                    "step: each micro-batch is stepped on alone",
                )
