"""A scheduler stepped with a fractional epoch whose two counts are in different units (F4):
AG317.

``CosineAnnealingWarmRestarts`` (and any scheduler whose ``step`` takes the epoch) is driven
per update with ``sched.step(epoch + i / iters)``: the fraction of the epoch done. Its
numerator and denominator must count the same thing. With gradient accumulation the
loop's index ``i`` counts micro-batches while a denominator built as ``len(loader) // K``
counts optimizer steps: the fraction runs K times fast (the restarts and the decay come K
times early, and the epoch part passes 1 long before the epoch ends). An error when the
numerator holds a counter of micro-batches of an accumulating loop (the loop's own index
with the step gated by a boundary, or a counter incremented per micro-batch) and the
denominator is divided by K (inline or in the one value of its name). Silent when the
numerator is divided by K too (``(i + 1) // K / steps_per_epoch``) or the denominator
counts micro-batches (``(i + 1) / len(loader)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.deepspeed import _name_values
from accumguard.static.lint.families.lrcounter import _accumulating_windows, _micro_window, _writes
from accumguard.static.lint.families.schedule import _is_scheduler

__all__ = ["fractional_epoch_in_mixed_units"]


def _divides_by_k(ctx: FileContext, expr: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv | ast.Div)
               and ctx.mentions_accum(n.right) for n in walk_all(expr))


def _steps_count(ctx: FileContext, scope: ast.AST, den: ast.AST) -> str | None:
    """The text of what makes ``den`` a count of optimizer steps (a division by K, inline or
    the one value of its name), else None."""
    if _divides_by_k(ctx, den):
        return ast.unparse(den)
    if isinstance(den, ast.Name):
        values = _name_values(ctx, scope)[0].get(den.id, [])
        if len(values) == 1 and _divides_by_k(ctx, values[0]):
            return f"{den.id} = {ast.unparse(values[0])}"
    return None


def _micro_counter(ctx: FileContext, scope: ast.AST, num: ast.AST) -> tuple[str, ast.AST] | None:
    """A name in ``num`` that counts micro-batches of an accumulating loop, with that loop;
    None when ``num`` divides by K itself (it then counts optimizer steps)."""
    if _divides_by_k(ctx, num):
        return None
    for n in walk_all(num):
        if isinstance(n, ast.Name) and not ctx.mentions_accum(n):
            window = _micro_window(ctx, scope, n.id) or _per_micro_increment(ctx, scope, n.id)
            if window is not None:
                return n.id, window
    return None


def _per_micro_increment(ctx: FileContext, scope: ast.AST, name: str) -> ast.AST | None:
    """The accumulating loop in which ``name += 1`` runs on every micro-batch (not under the
    boundary); a reset per epoch is what a fraction of the epoch wants, so resets are fine."""
    incs = _writes(ctx, scope).get(name, ([], []))[0]
    if len(incs) != 1 or not (isinstance(incs[0].op, ast.Add) and isinstance(incs[0].value, ast.Constant)
                              and incs[0].value.value == 1):
        return None
    loop = ctx.enclosing(incs[0], (ast.For, ast.AsyncFor, ast.While))
    if loop is None or loop not in _accumulating_windows(ctx) or ctx.guarded(incs[0], loop):
        return None
    return loop


@rule("AG317")
def fractional_epoch_in_mixed_units(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if call_attr(call) != "step" or not _is_scheduler(ctx, receiver(call)):
            continue
        arg = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "epoch"), None)
        if arg is None:
            continue
        scope = ctx.scope_of(call)
        for div in walk_all(arg):
            if not (isinstance(div, ast.BinOp) and isinstance(div.op, ast.Div)):
                continue
            counted = _micro_counter(ctx, scope, div.left)
            steps = _steps_count(ctx, scope, div.right) if counted else None
            if counted is None or steps is None:
                continue
            name, window = counted
            yield ctx.finding(
                "AG317", call,
                f"`{ast.unparse(call)}` passes a fraction of the epoch whose numerator `{name}` "
                f"counts micro-batches (the loop at line {getattr(window, 'lineno', '?')} steps "
                f"the optimizer once per K of them) while its denominator counts optimizer "
                f"steps (`{steps}`): the fraction runs K x fast, so the schedule's decay and "
                "restarts come K x early")
            break
