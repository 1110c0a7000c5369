"""AG102 (F3) through a clearing helper: ``zero_grad`` in a function of the file that the
window calls on every micro-step.

The window's own calls and those of the backward helpers it calls are classified by the
window facts (:mod:`.._ctx_windows`, one level). A function that only clears the gradients
(``def _reset(self): self.opt.zero_grad()``: no backward, no step of its own) called from
the window or from one of its backward helpers, with neither the call nor the clear inside
it under a boundary test, erases the window's gradient on every micro-step just the same:
only the last micro-batch reaches the optimizer. Followed one level from the window or its
backward helpers, for a name defined once in the file (a method through ``self.name(...)``
in its own class).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, is_backward, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["zero_grad_helper_in_window"]


def _clearing_helpers(ctx: FileContext) -> dict[ast.AST, list[ast.Call]]:
    """Functions defined once whose body clears gradients unconditionally (its zero_grad
    calls) and neither steps nor runs a backward (cached)."""
    def compute() -> dict[ast.AST, list[ast.Call]]:
        out: dict[ast.AST, list[ast.Call]] = {}
        for name, fns in ctx.defs_by_name().items():
            if len(fns) != 1 or name.startswith("__"):
                continue
            fn = fns[0]
            calls = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Call)]
            if any(is_backward(c) or call_attr(c) == "step" for c in calls):
                continue
            clears = [c for c in calls if call_attr(c) == "zero_grad" and receiver(c) is not None
                      and ctx.kind_of_receiver(receiver(c)) != "engine" and not ctx.guarded(c, fn)]
            if clears:
                out[fn] = clears
        return out
    return ctx._cached("clearing_helpers", ctx.tree, compute)  # type: ignore[no-any-return]


def _callee(ctx: FileContext, call: ast.Call) -> ast.AST | None:
    """The function of the file ``call`` runs: ``name(...)`` (not a method) or
    ``self.name(...)`` (a method of the caller's own class); None when not one definition."""
    if isinstance(call.func, ast.Name):
        name, method = call.func.id, False
    elif (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
          and call.func.value.id == "self"):
        name, method = call.func.attr, True
    else:
        return None
    fns = ctx.defs_by_name().get(name, [])
    if len(fns) != 1:
        return None
    owner = ctx.parents.get(fns[0])
    if method != isinstance(owner, ast.ClassDef):
        return None
    if method and ctx.enclosing(call, (ast.ClassDef,)) is not owner:
        return None
    return fns[0]


@rule("AG102")
def zero_grad_helper_in_window(ctx: FileContext) -> Iterator[Finding]:
    helpers = _clearing_helpers(ctx)
    if not helpers:
        return
    seen: set[int] = set()
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if (not facts.accumulating or facts.unguarded_optimizer_steps or facts.summed_loss
                or facts.accelerate):
            continue
        for part in (window, *ctx.inlined(window)):
            for site in ctx.local_nodes(part):
                if not isinstance(site, ast.Call):
                    continue
                fn = _callee(ctx, site)
                if fn is None or fn not in helpers or fn is part or ctx.guarded(site, window):
                    continue
                for clear in helpers[fn]:
                    name = dotted(receiver(clear)) or "model"
                    if id(clear) in seen or name in facts.own_rate:
                        continue
                    seen.add(id(clear))
                    assert isinstance(fn, FUNCS)
                    yield ctx.finding(
                        "AG102",
                        clear,
                        f"`{name}.zero_grad()` in `{fn.name}()`, which runs on every micro-batch "
                        f"(called at line {site.lineno}), erases the gradients accumulated so far: "
                        "only the last micro-batch reaches the optimizer",
                    )
