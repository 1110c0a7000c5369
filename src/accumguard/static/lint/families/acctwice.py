"""A second ``Accelerator`` that resets the accumulation steps (F1): AG340.

Accelerate keeps one ``GradientState`` per process, shared by every ``Accelerator``: each
new ``Accelerator(...)`` hands it its own ``GradientAccumulationPlugin`` (``num_steps`` =
its ``gradient_accumulation_steps``, 1 by default) and the state takes it. A helper that
builds its own ``Accelerator()`` (a metrics meter, an evaluator) after the training's
``Accelerator(gradient_accumulation_steps=K)`` sets K back to 1: ``accumulate()`` then syncs
and lets the optimizer step after every micro-batch, with the loss not divided by K.

Reported on the later ``Accelerator(...)`` built without ``gradient_accumulation_steps`` (and
no ``**kwargs``), when it runs after the training's one: in the same function below it, or in
a function or class of the file that the training's function calls (builds) below it. An
``Accelerator()`` built before the training's is harmless (the training's sets K again).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["second_accelerator_resets_k"]

_K_ARGS = ("gradient_accumulation_steps", "gradient_accumulation_plugin")


def _accelerators(ctx: FileContext) -> list[ast.Call]:
    return [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Accelerator"]


def _sets_k(call: ast.Call) -> bool | None:
    """True when the call sets K above 1 (or to a name), False when it leaves K at 1, None
    when ``**kwargs`` may carry it."""
    if any(k.arg is None for k in call.keywords):
        return None
    for k in call.keywords:
        if k.arg in _K_ARGS:
            return not (isinstance(k.value, ast.Constant) and k.value.value == 1)
    return False


def _builders(node: ast.AST, ctx: FileContext) -> set[str]:
    """The names whose call runs ``node``: its function, and the class of a method."""
    fn = ctx.enclosing(node, FUNCS)
    if fn is None or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    names = {fn.name}
    cls = ctx.enclosing(fn, (ast.ClassDef,))
    if isinstance(cls, ast.ClassDef) and fn.name == "__init__":
        names = {cls.name}
    return names


def _runs_after(ctx: FileContext, later: ast.Call, first: ast.Call) -> int | None:
    """The line in ``first``'s function from which ``later`` runs after ``first``: ``later``
    itself below it in the same function, or a call of ``later``'s builder below it."""
    scope = ctx.enclosing(first, FUNCS)
    if ctx.enclosing(later, FUNCS) is scope:
        return later.lineno if later.lineno > first.lineno else None
    builders = _builders(later, ctx)
    if not builders or scope is None:
        return None
    for n in ast.walk(scope):
        if isinstance(n, ast.Call) and n.lineno > first.lineno \
                and (dotted(n.func) or "").rsplit(".", 1)[-1] in builders:
            return n.lineno
    return None


@rule("AG340")
def second_accelerator_resets_k(ctx: FileContext) -> Iterator[Finding]:
    calls = _accelerators(ctx)
    if len(calls) < 2:
        return
    training = [c for c in calls if _sets_k(c)]
    for later in calls:
        if _sets_k(later) is not False:
            continue
        for first in training:
            line = _runs_after(ctx, later, first)
            if line is None:
                continue
            yield ctx.finding(
                "AG340", later,
                f"this `Accelerator(...)` leaves gradient_accumulation_steps at 1 and is built "
                f"after the training's `{ast.unparse(first.func)}(..., "
                f"gradient_accumulation_steps=...)` (line {first.lineno}; built at line {line}): "
                "Accelerate keeps one GradientState per process and each Accelerator sets its "
                "accumulation steps, so K is 1 from then on: accumulate() syncs and the "
                "optimizer steps after every micro-batch")
            break
