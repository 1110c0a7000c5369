"""AG165 (F7): an optimizer stepped at the window's boundary whose gradients nothing in the
file ever clears.

Two optimizers over different parameters (a Muon/SGD group for the matrices and Adam for the
rest, an encoder and a head) both step at the boundary, but only one is given
``zero_grad()``: the other's parameters keep every earlier window's gradient in ``.grad``,
and each of its steps applies the sum of all windows so far (the large batch's gradient
plus every previous one). Reported only when nothing in the file could clear them: no
``zero_grad`` of that optimizer anywhere, no ``zero_grad`` of a module, of a name that is no
known optimizer (``for o in opts: o.zero_grad()``) or of anything given that optimizer, and
no ``p.grad = None`` / ``p.grad.zero_()`` by hand; and another optimizer stepped in the same
function is cleared (the loop clears by optimizer, and forgot one).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_ownrate import stepped_name
from accumguard.static.lint._rule import rule

__all__ = ["stepped_optimizer_never_cleared"]


def _clears_by_hand(ctx: FileContext) -> bool:
    """``x.grad = None``, ``x.grad.zero_()``, ``x.grad.data.zero_()``, ``x.grad = 0`` anywhere."""
    for n in ctx.of(ast.Assign, ast.Call):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "grad"
                                             for t in n.targets):
            return True
        if isinstance(n, ast.Call) and call_attr(n) in ("zero_", "fill_", "mul_") \
                and "grad" in (dotted(receiver(n)) or ""):
            return True
    return False


@rule("AG165")
def stepped_optimizer_never_cleared(ctx: FileContext) -> Iterator[Finding]:
    zero_recv = [dotted(receiver(c)) for c in ctx.of(ast.Call)
                 if call_attr(c) in ("zero_grad", "clear_grad")]
    if not zero_recv or any(r is None or ctx.kind_of_receiver(ast.parse(r, mode="eval").body)
                            != "optimizer" for r in zero_recv) or _clears_by_hand(ctx):
        return  # a module's zero_grad, an unnamed or looped receiver: what it clears is not in sight
    cleared = set(zero_recv)
    said: set[str] = set()
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating:
            continue
        fn = ctx.enclosing(window, FUNCS) or ctx.tree
        # the window's own steps, or those of the loop around it (`for s in ...: for k in
        # range(K): ...backward()` then the steps after the inner loop)
        outer = ctx.enclosing(window, (ast.For, ast.AsyncFor, ast.While))
        steps = [c for c, kind in facts.steps if kind == "optimizer"] + [
            c for c in (ctx.local_nodes(outer) if outer is not None else [])
            if ctx.is_step(c) and ctx.enclosing(c, (ast.For, ast.AsyncFor, ast.While)) is outer]
        names = {n for c in steps if (n := stepped_name(c))}
        if len(names) < 2 or not names & cleared:
            continue
        for call in steps:
            name = stepped_name(call)
            if not name or name in cleared or name in said:
                continue
            handed = [c for c in ctx.local_nodes(fn) if isinstance(c, ast.Call)
                      and any(dotted(a) == name for a in c.args) and c is not call]
            if handed:
                continue  # given to a helper that may clear it
            said.add(name)
            others = ", ".join(f"`{n}`" for n in sorted(names & cleared))
            yield ctx.finding(
                "AG165",
                call,
                f"`{name}.step()` runs at the window's boundary, but nothing in the file clears "
                f"`{name}`'s gradients (no `{name}.zero_grad()`, while {others} is cleared): "
                "its parameters keep every earlier window's gradient in .grad, and each step "
                "applies the sum of all windows so far",
                fix=f"call `{name}.zero_grad()` after `{name}.step()`, as for the other optimizer",
            )
