"""What AG117 (:mod:`.window`) and AG141 (:mod:`.tailscale`) know of a pass's last window:
the hand-written ``for`` windows, the modulo that gates their step (also inside a helper the
window calls), whether the counter starts again at every pass, and what the repeating loop
does outside the window (a flush step, a clear of the gradients)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.lint._ast import FUNCS, call_attr, dotted, position, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_windows import WindowFacts
from accumguard.static.lint._lengths import static_len
from accumguard.static.lint.families._modguard import (
    ModGuard,
    assignments_by_name,
    call_test,
    calls_by_name,
    int_constant,
    mod_term,
)

__all__ = ["boundary_equality", "clears_first", "clears_or_steps_outside", "flag_value",
           "hand_for_windows",
           "length_from_callers", "pure_mod_guard", "restarts_each_pass", "site_in"]


def pure_mod_guard(ctx: FileContext, call: ast.AST, window: ast.AST) -> tuple[ast.If, ModGuard] | None:
    """The ``if`` that gates ``call`` with a modulo and nothing else (``(i + 1) % K == 0``), and
    its guard; None when any boundary test on the way says more (``or i + 1 == len(loader)``,
    an ``is_last`` flag): such a guard may flush the end of the data."""
    found: tuple[ast.If, ModGuard] | None = None
    child, cur = call, ctx.parents.get(call)
    while cur is not None and cur is not window:
        if isinstance(cur, FUNCS) and (site := site_in(ctx, cur, window)) is not None:
            child, cur = site, ctx.parents.get(site)  # a helper the window calls: at its call
            continue
        if isinstance(cur, ast.If) and child is not cur.test and ctx.is_boundary_test(cur.test):
            value = boundary_equality(ctx, cur.test, window)
            guard = mod_term(call_test(ctx, value) or value)  # (a predicate: its test)
            if guard is None or found is not None or child not in cur.body:
                return None
            found = (cur, guard)
        child, cur = cur, ctx.parents.get(cur)
    return found if cur is window else None


def site_in(ctx: FileContext, fn: ast.AST, window: ast.AST) -> ast.Call | None:
    """The one call of the file's function ``fn`` inside ``window`` (``apply_update()`` under
    the window's boundary test), else None."""
    inside = {id(n) for n in ctx.local_nodes(window)}
    sites = [c for c in ctx.call_sites(fn) if id(c) in inside]
    return sites[0] if len(sites) == 1 else None


def boundary_equality(ctx: FileContext, test: ast.AST, window: ast.AST) -> ast.AST:
    """The boundary test as a modulo equality where a flag says the opposite: Fabric's
    ``is_accumulating = (i + 1) % K != 0`` ... ``if not is_accumulating:`` reads as
    ``(i + 1) % K == 0``; any other test as :func:`flag_value` gives it."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) \
            and isinstance(test.operand, ast.Name):
        inner = flag_value(ctx, test.operand, window)
        if isinstance(inner, ast.Compare) and len(inner.ops) == 1 \
                and isinstance(inner.ops[0], ast.NotEq):
            return ast.Compare(left=inner.left, ops=[ast.Eq()], comparators=inner.comparators)
    return flag_value(ctx, test, window)


def flag_value(ctx: FileContext, test: ast.AST, window: ast.AST) -> ast.AST:
    """The value of a boundary flag tested by name (``sync = (i + 1) % K == 0`` ...
    ``if sync:``) when the window assigns it exactly once, else ``test`` itself."""
    if not isinstance(test, ast.Name):
        return test
    values = [n.value for n in ctx.local_nodes(window)
              if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign)
              and any(isinstance(t, ast.Name) and t.id == test.id
                      for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    if len(values) == 1 and values[0] is not None:
        return values[0]
    return test


def restarts_each_pass(ctx: FileContext, window: ast.For | ast.AsyncFor, counter: str, repeat: ast.AST) -> bool:
    """``counter`` starts again at every pass over the data: the window loop's own index, or a
    counter set to an integer inside the repeating loop (or the per-epoch function) before it."""
    target = window.target
    index = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
    if dotted(index) == counter:
        return True
    wpos = position(window)
    inits = [
        n for n in assignments_by_name(ctx, ctx.scope_of(window)).get(counter, ())
        if position(n) < wpos and int_constant(getattr(n, "value", None)) is not None
    ]
    if not inits:
        return False
    cur = ctx.parents.get(inits[-1])
    while cur is not None and cur is not repeat:
        cur = ctx.parents.get(cur)
    return cur is repeat


def clears_or_steps_outside(ctx: FileContext, window: ast.AST, repeat: ast.AST
                             ) -> tuple[bool, ast.Call | None]:
    """What the repeating loop (or per-epoch function) does outside the window: (it clears
    the gradients: ``zero_grad``, ``p.grad = None``; the call that steps the optimizer, by
    itself or through a function of the file, e.g. a flush of the pass's last window)."""
    inside = {id(n) for n in ctx.local_nodes(window)}
    clears, steps = False, None
    for n in ctx.local_nodes(repeat):
        if id(n) in inside:
            continue
        if isinstance(n, ast.Call):
            name = call_attr(n)
            body = ctx.callee_of(n)
            inner = [c for c in ctx.local_nodes(body) if isinstance(c, ast.Call)] \
                if isinstance(body, FUNCS) else []
            if name == "zero_grad" or any(call_attr(c) == "zero_grad" for c in inner):
                clears = True
            if (name == "step" and ctx.kind_of_receiver(receiver(n)) in ("optimizer", "scaler")) \
                    or any(call_attr(c) == "step" and ctx.kind_of_receiver(receiver(c))
                           in ("optimizer", "scaler") for c in inner):
                steps = steps or n
        elif isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "grad" for t in n.targets
        ):
            clears = True  # p.grad = None
    return clears, steps


def clears_first(ctx: FileContext, window: ast.AST, backwards: list[ast.Call]) -> bool:
    """The window clears the gradients before its first backward (``opt.zero_grad()`` at
    the top of each window): a gradient left from the previous pass is dropped there."""
    first = min((position(b) for b in backwards), default=None)
    return first is not None and any(
        isinstance(n, ast.Call) and call_attr(n) == "zero_grad" and position(n) < first
        for n in ctx.local_nodes(window))


def length_from_callers(ctx: FileContext, window: ast.For | ast.AsyncFor) -> int | None:
    """The loop's length when it iterates a parameter of its function and every call of that
    function in the file passes data of the same evident length (``train_one_epoch([... for _ in
    range(8)])``)."""
    it = window.iter
    while isinstance(it, ast.Call) and call_attr(it) in ("enumerate", "tqdm") and it.args:
        it = it.args[0]
    fn = ctx.enclosing(window, (ast.FunctionDef, ast.AsyncFunctionDef))
    if not isinstance(it, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if it.id not in params:
        return None
    index = params.index(it.id) - (1 if params and params[0] in ("self", "cls") else 0)
    lengths: set[int | None] = set()
    for call in calls_by_name(ctx).get(fn.name, ()):
        arg = next((k.value for k in call.keywords if k.arg == it.id), None)
        if arg is None and 0 <= index < len(call.args):
            arg = call.args[index]
        lengths.add(static_len(ctx, arg) if arg is not None else None)
    return lengths.pop() if len(lengths) == 1 else None


def hand_for_windows(ctx: FileContext) -> Iterator[tuple[ast.For | ast.AsyncFor, WindowFacts]]:
    """The ``for`` windows a hand-written loop accumulates in (not Accelerate's, not a loss
    summed and normalised later), with their facts: where a pass's last, partial window is
    judged (AG117, AG141)."""
    for window in ctx.windows():
        if not isinstance(window, ast.For | ast.AsyncFor):
            continue
        facts = ctx.window_facts(window)
        if facts.accumulating and not facts.accelerate and not facts.summed_loss:
            yield window, facts
