"""AG158 (F4): a weight average (EMA, a momentum teacher) updated on every micro-step.

An exponential moving average of the weights is defined per optimizer step: after each
step, ``ema = m * ema + (1 - m) * weights``. In a hand-written accumulation window that
gates its optimizer step (``if (i + 1) % K == 0:``) but updates the average outside that
gate, the average moves K times per optimizer step towards weights that did not change in
between: it follows them as with momentum m^K, and a teacher that feeds the loss (DINO,
BYOL, MoCo, mean teacher) changes between the micro-batches of one window, so their
targets are not the large batch's either. Reported when the window accumulates (its
optimizer step is gated), the update is reached on every micro-step (no boundary test
around it), and it is one of: a loop over ``zip(a.parameters(), b.parameters())`` (or
their state dicts) updating one side in place (``mul_``/``lerp_``/``copy_``), a function of
the file holding such a loop, or ``.update(...)``/``.update_parameters(...)`` of an object
built by an EMA class (``AveragedModel``, ``ModelEma*``, ``ExponentialMovingAverage``...) or
named as one. A warning: an average kept only for evaluation leaves the training update
as it is (the average itself is still not the large batch's).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["ema_every_micro_step"]

_EMA_CLASS = re.compile(r"ema|averagedmodel|movingaverage|meanteacher", re.IGNORECASE)
_EMA_NAME = re.compile(r"(^|_)(ema|swa|teacher|momentum_encoder|shadow)(_|$)|ema$", re.IGNORECASE)
_INPLACE = frozenset({"mul_", "lerp_", "copy_"})
_WEIGHTS = frozenset({"parameters", "named_parameters", "state_dict", "buffers", "values"})


def _average_loop(loop: ast.AST) -> bool:
    """``for a, b in zip(x.parameters(), y.parameters()): a.mul_(m).add_(b, alpha=1 - m)``
    (or ``lerp_``, or ``copy_`` of a blend): one model's weights moved towards another's."""
    if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)
            and call_attr(loop.iter) == "zip" and len(loop.iter.args) >= 2):
        return False
    if sum(1 for a in loop.iter.args if any(isinstance(c, ast.Call) and call_attr(c) in _WEIGHTS
                                            for c in walk_all(a))) < 2:
        return False
    return any(isinstance(c, ast.Call) and call_attr(c) in _INPLACE
               for stmt in loop.body for c in walk_all(stmt))


def _averaging_functions(ctx: FileContext) -> dict[str, ast.AST]:
    """Functions (and methods) of the file, defined once, whose body holds an averaging loop
    or ``torch._foreach_lerp_``/``_foreach_mul_`` over weights: by name."""
    def compute() -> dict[str, ast.AST]:
        out: dict[str, ast.AST] = {}
        for name, defs in ctx.defs_by_name().items():
            if len(defs) != 1:
                continue
            body = list(walk_all(defs[0]))
            if any(_average_loop(n) for n in body) or any(
                    isinstance(n, ast.Call) and call_attr(n) in ("_foreach_lerp_", "_foreach_mul_")
                    for n in body):
                out[name] = defs[0]
        return out
    return ctx._cached("averaging_functions", ctx.tree, compute)  # type: ignore[no-any-return]


def _ema_object(ctx: FileContext, expr: ast.AST | None) -> bool:
    """``expr`` holds an EMA: built by a class so named, or named so itself."""
    d = dotted(expr) if expr is not None else None
    if d is None:
        return False
    if _EMA_NAME.search(d.rsplit(".", 1)[-1]):
        return True
    for value in ctx.values_by_name().get(d, []):
        if isinstance(value, ast.Call) and _EMA_CLASS.search(dotted(value.func) or ""):
            return True
    return False


def _updates(ctx: FileContext, window: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """The weight-average updates in ``window``'s own code: (node, how it reads)."""
    functions = _averaging_functions(ctx)
    for n in ctx.local_nodes(window):
        if _average_loop(n):
            yield n, "an in-place average of one model's weights towards another's"
        elif isinstance(n, ast.Call):
            name = call_attr(n)
            if name in functions and ctx.enclosing(n, FUNCS) is not functions[name]:
                yield n, f"`{name}` averages one model's weights towards another's"
            elif name in ("update", "update_parameters") and _ema_object(ctx, receiver(n)):
                yield n, f"`{ast.unparse(n.func)}` updates a moving average of the weights"


def _steps_after(ctx: FileContext, window: ast.AST) -> list[ast.Call]:
    """The optimizer steps of the loop around ``window`` that run after it (a window that is
    a loop over the micro-batches, stepped once it ends)."""
    outer = ctx.enclosing(window, (ast.For, ast.AsyncFor, ast.While))
    if outer is None:
        return []
    inside = {id(n) for n in walk_all(window)}
    return [c for c in ctx.local_nodes(outer)
            if id(c) not in inside and ctx.is_step(c)
            and getattr(c, "lineno", 0) > getattr(window, "lineno", 0)]


def _averaged(node: ast.AST) -> str | None:
    """The model an update moves: the first argument of a function of the file
    (``update_teacher(teacher, student, m)``), or the first model of the loop's ``zip``."""
    if isinstance(node, ast.Call) and node.args:
        return dotted(node.args[0])
    if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and node.iter.args:
        first = node.iter.args[0]
        if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute):
            return dotted(first.func.value)
    return None


def _feeds_the_window(ctx: FileContext, window: ast.AST, update: ast.AST) -> str | None:
    """The averaged model's name when another call of the window is given it or calls it
    (``loss_fn(student, teacher, x)``, ``teacher(x)``): a teacher that feeds the loss."""
    name = _averaged(update)
    if name is None:
        return None
    inside = {id(n) for n in walk_all(update)}
    for n in ctx.local_nodes(window):
        if isinstance(n, ast.Call) and id(n) not in inside and (
                dotted(n.func) == name or any(dotted(a) == name for a in n.args)):
            return name
    return None


@rule("AG158")
def ema_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        gated = [c for c, kind in facts.steps if kind == "optimizer" and ctx.guarded(c, window)]
        if facts.accumulating and not facts.steps:
            gated = _steps_after(ctx, window)  # (``for k in range(K): ...`` then the step)
        if not facts.accumulating or not gated:
            continue
        for node, what in _updates(ctx, window):
            if ctx.guarded(node, window):
                continue
            fed = _feeds_the_window(ctx, window, node)
            if fed is not None:
                yield replace(ctx.finding(
                    "AG158",
                    node,
                    f"{what} on every micro-step, while the optimizer steps only at the "
                    f"window's boundary (`{ast.unparse(gated[0])}`, line {gated[0].lineno}), and "
                    f"the averaged model `{fed}` feeds this window's loss: its targets change "
                    "between the micro-batches of one window (and the average moves K times per "
                    "optimizer step, momentum m^K), so the update is not the large batch's",
                ), severity=Severity.ERROR)
                break
            yield ctx.finding(
                "AG158",
                node,
                f"{what} on every micro-step, while the optimizer steps only at the window's "
                f"boundary (`{ast.unparse(gated[0])}`, line {gated[0].lineno}): the average moves "
                "K times per optimizer step towards weights that did not change in between "
                "(momentum m^K), and a teacher that feeds the loss changes between the "
                "micro-batches of one window",
            )
            break
