"""A backward before the training loop whose gradient nothing clears (F7): AG316.

A script that runs one forward and backward before it trains (a ``torch.compile`` warm-up, a
check that every parameter gets a gradient, a profiling pass) leaves that gradient in
``.grad``. A loop that clears the gradient only after each optimizer step (nanoGPT's
``optimizer.step(); optimizer.zero_grad()``) then adds it to its first window: the first
update is not the large batch's. Reported (a warning: which parameters that backward reached
is not in sight) for a statement holding a backward, in the same block as a later loop that
backwards and steps an optimizer, when no ``zero_grad`` runs between them and the loop's
first ``zero_grad`` comes after its first backward. Silent when anything clears the
gradient in between or the loop clears it before its first backward. The backward may sit in
a helper of the file the code before the loop calls (``self.check_gradient_flow()``: one
backward outside any loop, no step, nothing cleared after it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, is_backward, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["backward_before_the_loop"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_CLEARS = ("zero_grad", "zero_grad_", "set_to_none")


def _calls(stmt: ast.AST) -> list[ast.Call]:
    return sorted((n for n in walk_all(stmt) if isinstance(n, ast.Call)),
                  key=lambda n: (n.lineno, n.col_offset))


def _clears(call: ast.Call) -> bool:
    return call_attr(call) in _CLEARS or (
        isinstance(call.func, ast.Attribute) and call.func.attr == "zero_" and "grad" in ast.unparse(call.func))


def _bodies(ctx: FileContext) -> Iterator[list[ast.stmt]]:
    yield ctx.tree.body
    for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
        yield fn.body
    for node in ctx.of(ast.With, ast.AsyncWith):
        yield node.body


@rule("AG316")
def backward_before_the_loop(ctx: FileContext) -> Iterator[Finding]:
    for body in _bodies(ctx):
        probe: ast.Call | None = None
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            calls = _calls(stmt)
            if isinstance(stmt, _LOOPS):
                if probe is not None and _steps_and_clears_late(ctx, calls):
                    via = "" if is_backward(probe) else f" (in `{ast.unparse(probe.func)}()`)"
                    f = ctx.finding(
                        "AG316", probe,
                        f"a backward at line {probe.lineno}{via} runs before the training loop at line "
                        f"{stmt.lineno}, nothing clears its gradient in between, and the loop "
                        "clears gradients only after its optimizer steps: the gradient of this "
                        "pass (a warm-up or check) is added to the first window's, so the first "
                        "update is not the large batch's")
                    yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                    break
                probe = None if any(_clears(c) for c in calls) else probe
                continue
            back = [c for c in calls if is_backward(c)]
            clears = [c for c in calls if _clears(c)]
            if back and not any(isinstance(n, _LOOPS) for n in walk_all(stmt)):
                probe = back[-1]
            elif not back and (helper := _probe_helper(ctx, calls)) is not None:
                probe = helper
            if clears and (probe is None or (clears[-1].lineno, clears[-1].col_offset)
                           > (probe.lineno, probe.col_offset)):
                probe = None


def _probe_helper(ctx: FileContext, calls: list[ast.Call]) -> ast.Call | None:
    """A call of a function of the file that runs one backward outside any loop and clears
    nothing after it (``self.check_gradient_flow()``): the call, else None."""
    for call in calls:
        fn = ctx.callee_of(call)
        if fn is None:
            continue
        inner = _calls(fn)
        backs = [c for c in inner if is_backward(c)]
        loop = ctx.enclosing(backs[0], _LOOPS) if len(backs) == 1 else None
        if len(backs) != 1 or (loop is not None and ctx.enclosing(loop, FUNCS) is fn):
            continue  # (a backward in a loop of the helper is training, not a probe)
        if any(_clears(c) and (c.lineno, c.col_offset) > (backs[0].lineno, backs[0].col_offset)
               for c in inner):
            continue
        if any(call_attr(c) == "step" for c in inner):
            continue  # (a helper that steps is a training step, not a probe)
        return call
    return None


def _steps_and_clears_late(ctx: FileContext, calls: list[ast.Call]) -> bool:
    """The loop backwards, steps an optimizer, and its first clearing comes after its first
    backward (or it never clears)."""
    backs = [c for c in calls if is_backward(c)]
    steps = [c for c in calls if call_attr(c) == "step"
             and ctx.kind_of_receiver(receiver(c)) in ("optimizer", "engine")]
    if not backs or not steps:
        return False
    clears = [c for c in calls if _clears(c)]
    first = (backs[0].lineno, backs[0].col_offset)
    return bool(clears) and all((c.lineno, c.col_offset) > first for c in clears)
