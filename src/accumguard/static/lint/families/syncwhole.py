"""AG111's shape with no flag: the whole window inside one ``with model.no_sync():`` (or
Fabric's ``with fabric.no_backward_sync(model, enabled=...):``, entered once around the loop).

``no_sync()`` switches DDP's reduction off for the backwards run inside it; leaving the
block does not reduce what was accumulated (DDP reduces in the first synced backward after
it). A block that runs every backward of the window (a loop of backwards inside it) with the
optimizer step after it and no backward in between steps each rank on its own gradient: the
averaging over ranks never happens. Silent when a backward follows the block before the
step (the usual last micro-step outside it), when the file reduces gradients by hand, or
when the step is out of sight.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_BACKWARDS = ("backward", "manual_backward")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _backwards(ctx: FileContext, node: ast.AST, depth: int = 1) -> list[ast.Call]:
    """Backward calls under ``node``, and in the file's functions it calls (one level)."""
    out: list[ast.Call] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if call_attr(n) in _BACKWARDS:
                out.append(n)
            elif depth and (fn := ctx.callee_of(n)) is not None:
                out += _backwards(ctx, fn, depth - 1)
    return out


def _looped_backward(ctx: FileContext, with_: ast.With) -> bool:
    """A backward runs inside a loop inside the block: several micro-steps in it."""
    for stmt in with_.body:
        for n in ast.walk(stmt):
            if isinstance(n, _LOOPS) and _backwards(ctx, n):
                return True
    return False


def _after(ctx: FileContext, node: ast.stmt) -> list[ast.stmt]:
    """The statements that run after ``node`` in its function: the rest of its block, then
    the rest of each enclosing block up to the function."""
    out: list[ast.stmt] = []
    cur: ast.AST = node
    while True:
        parent = ctx.parents.get(cur)
        if parent is None or isinstance(parent, FUNCS):
            if parent is not None:
                body = parent.body
                out += body[body.index(cur) + 1:] if cur in body else []
            return out
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and cur in block:
                out += block[block.index(cur) + 1:]
                if isinstance(parent, _LOOPS) and field == "body":
                    return out  # (the loop's next iteration: out of reach, stop here)
        cur = parent


def _step_before_backward(ctx: FileContext, stmts: list[ast.stmt]) -> ast.Call | None | bool:
    """The first optimizer ``.step()`` among ``stmts`` if no backward comes before it;
    False when a backward comes first; None when neither is there."""
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call) and call_attr(n) in _BACKWARDS:
                return False
            if isinstance(n, ast.Call) and call_attr(n) == "step" and not n.args \
                    and "sched" not in (dotted(n.func) or "").lower():
                return n
        if _backwards(ctx, stmt):
            return False
    return None


def _fabric_block(call: ast.Call) -> bool:
    """``fabric.no_backward_sync(model)`` / ``(model, enabled=<one value for the block>)``:
    entered once around the window's loop, its ``enabled`` is fixed for every backward in it
    (only a literal False leaves the sync on)."""
    if call_attr(call) != "no_backward_sync" or len(call.args) != 1:
        return False
    enabled = next((k.value for k in call.keywords if k.arg == "enabled"), None)
    return not (isinstance(enabled, ast.Constant) and enabled.value is False)


def reduces_grads_by_hand(ctx: FileContext) -> bool:
    return any(call_attr(c) in ("all_reduce", "all_reduce_coalesced", "reduce_scatter",
                                "all_gather", "reduce") for c in ctx.of(ast.Call))


@rule("AG111")
def whole_window_under_no_sync(ctx: FileContext) -> Iterator[Finding]:
    if reduces_grads_by_hand(ctx):
        return
    for with_ in ctx.of(ast.With):
        ctxs = [i.context_expr for i in with_.items]
        sync = next((c for c in ctxs if isinstance(c, ast.Call) and (
            (call_attr(c) == "no_sync" and not c.args and not c.keywords)
            or _fabric_block(c))), None)
        stacked = False
        if sync is None:
            sync = _stacked_no_sync(with_)
            stacked = sync is not None
        if sync is None or not _looped_backward(ctx, with_):
            continue
        step = _step_before_backward(ctx, _after(ctx, with_))
        fn = ctx.enclosing(with_, FUNCS)
        if step is None and fn is not None:
            # the block's function returns to its one caller, which steps next
            sites = [st for s in ctx.call_sites(fn) if (st := _statement(ctx, s)) is not None]
            if len(sites) == 1:
                step = _step_before_backward(ctx, _after(ctx, sites[0]))
        if not isinstance(step, ast.Call):
            continue
        recv = ast.unparse(sync.func.value) if isinstance(sync.func, ast.Attribute) else "model"
        fabric = call_attr(sync) == "no_backward_sync"
        model = ast.unparse(sync.args[0]) if fabric else ""
        per_step = (f"{recv}.no_backward_sync({model}, enabled=not last)" if fabric
                    else f"(contextlib.nullcontext() if last else {recv}.no_sync())")
        inside = (f"`{ast.unparse(sync)}` entered on an ExitStack that spans the window's "
                  f"loop (line {with_.lineno}: a context entered there stays open until the "
                  "block ends, so every backward after the first entry runs inside it)"
                  if stacked else f"`with {ast.unparse(sync)}:` (a loop of backwards in the "
                  "block)")
        yield ctx.finding(
            "AG111", sync,
            f"every backward of the window runs inside {inside} and the optimizer steps at "
            f"line {step.lineno} with no "
            f"backward after the block: leaving it does not reduce what was "
            f"accumulated (DDP reduces in the next synced backward), so each rank steps on its "
            f"own gradient; run the window's last micro-step with the sync on "
            f"(`{per_step}`)",
            fix=f"enter a fresh context on each micro-step, `with {per_step}:` around its "
                "forward and backward, so the window's last backward runs with DDP's reduction on"
                + (" (not one ExitStack around the whole window)" if stacked else ""))


def _stacked_no_sync(with_: ast.With) -> ast.Call | None:
    """``with ExitStack() as stack:`` around a loop that runs
    ``stack.enter_context(model.no_sync())``: the ``no_sync()`` call, else None."""
    names = {i.optional_vars.id for i in with_.items
             if isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "ExitStack"
             and isinstance(i.optional_vars, ast.Name)}
    if not names:
        return None
    for stmt in with_.body:
        for loop in ast.walk(stmt):
            if not isinstance(loop, _LOOPS):
                continue
            for n in ast.walk(loop):
                if isinstance(n, ast.Call) and call_attr(n) == "enter_context" \
                        and isinstance(n.func, ast.Attribute) \
                        and isinstance(n.func.value, ast.Name) and n.func.value.id in names \
                        and n.args and isinstance(n.args[0], ast.Call) \
                        and call_attr(n.args[0]) == "no_sync":
                    return n.args[0]
    return None


def _statement(ctx: FileContext, node: ast.AST) -> ast.stmt | None:
    cur: ast.AST | None = node
    while cur is not None and not isinstance(cur, ast.stmt):
        cur = ctx.parents.get(cur)
    return cur
