"""A backward before the training loop whose gradient nothing clears (F7): AG316.

A script that runs one forward and backward before it trains (a ``torch.compile`` warm-up, a
check that every parameter gets a gradient, a profiling pass) leaves that gradient in
``.grad``. A loop that clears the gradient only after each optimizer step (nanoGPT's
``optimizer.step(); optimizer.zero_grad()``) then adds it to its first window: the first
update is not the large batch's. Reported (an error when it ran through the model the loop
trains and an optimizer holds; a warning when which parameters that backward reached
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
from accumguard.static.lint._ast import (
    FUNCS,
    OPTIMIZER_CLASSES,
    call_attr,
    dotted,
    is_backward,
    receiver,
    walk_all,
)
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
        before: list[ast.Call] = []  # the calls since the body began or was last cleared
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            calls = _calls(stmt)
            if isinstance(stmt, _LOOPS):
                if probe is not None and _steps_and_clears_late(ctx, calls):
                    via = "" if is_backward(probe) else f" (in `{ast.unparse(probe.func)}()`)"
                    shared = sorted(_models_of(ctx, before, probe) & _models_of(ctx, calls, None)
                                    & _optimized(ctx))
                    f = ctx.finding(
                        "AG316", probe,
                        f"a backward at line {probe.lineno}{via} runs before the training loop at line "
                        f"{stmt.lineno}"
                        + (f", through `{shared[0]}`, the model the loop trains" if shared else "")
                        + ", nothing clears its gradient in between, and the loop "
                        "clears gradients only after its optimizer steps: the gradient of this "
                        "pass (a warm-up or check) is added to the first window's, so the first "
                        "update is not the large batch's")
                    # an error when that backward ran through the loop's model; else which
                    # parameters it reached is not in sight
                    yield replace(f, severity=Severity.ERROR, confidence=Confidence.HIGH) \
                        if shared else replace(f, severity=Severity.WARNING,
                                               confidence=Confidence.MEDIUM)
                    break
                if any(_clears(c) for c in calls):
                    probe, before = None, []
                continue
            back = [c for c in calls if is_backward(c)]
            clears = [c for c in calls if _clears(c)]
            before += calls
            if back and not any(isinstance(n, _LOOPS) for n in walk_all(stmt)):
                probe = back[-1]
            elif not back and (helper := _probe_helper(ctx, calls)) is not None:
                probe = helper
            if clears and (probe is None or (clears[-1].lineno, clears[-1].col_offset)
                           > (probe.lineno, probe.col_offset)):
                probe, before = None, []


#: methods only a module has (their receiver is a model)
_MODULE_METHODS = frozenset({"parameters", "named_parameters", "no_sync", "train", "eval",
                             "state_dict", "load_state_dict", "modules", "named_modules"})
_WRAPS = frozenset({"DDP", "DistributedDataParallel", "compile", "fully_shard"})


def _optimized(ctx: FileContext) -> set[str]:
    """Modules whose parameters an optimizer is built on in sight: ``AdamW(model.parameters())``
    (or a comprehension over them), ``model.configure_optimizers(...)`` (nanoGPT), and the
    names a wrap of them is assigned to (``model = DDP(model)``)."""
    def compute() -> set[str]:
        out: set[str] = set()
        for c in ctx.of(ast.Call):
            name = dotted(c.func) or ""
            if isinstance(c.func, ast.Attribute) and c.func.attr == "configure_optimizers" \
                    and (d := dotted(c.func.value)):
                out.add(d)
            elif "optim" in name.lower() or name.rsplit(".", 1)[-1] in OPTIMIZER_CLASSES:
                for n in walk_all(c):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                            and n.func.attr in ("parameters", "named_parameters") \
                            and (d := dotted(n.func.value)):
                        out.add(d)
        for n in ctx.of(ast.Assign):  # `model = DDP(model)`, `self.net = torch.compile(net)`
            if isinstance(n.value, ast.Call) and n.value.args and len(n.targets) == 1 \
                    and (dotted(n.value.func) or "").rsplit(".", 1)[-1] in _WRAPS \
                    and dotted(n.value.args[0]) in out and (t := dotted(n.targets[0])):
                out.add(t)
        return out
    return ctx._cached("probe_optimized", ctx.tree, compute)  # type: ignore[no-any-return]


def _module_names(ctx: FileContext) -> set[str]:
    """Names the file uses as a module: the receiver of a module's own method
    (``model.parameters()``, ``model.no_sync()``), or assigned a class instance or a wrap
    (``model = GPT()``, ``model = DDP(model)``, ``self.model = torch.compile(net)``)."""
    def compute() -> set[str]:
        out: set[str] = set()
        for c in ctx.of(ast.Call):
            if isinstance(c.func, ast.Attribute) and c.func.attr in _MODULE_METHODS \
                    and (d := dotted(c.func.value)):
                out.add(d)
        for n in ctx.of(ast.Assign):
            if isinstance(n.value, ast.Call) and len(n.targets) == 1 \
                    and (t := dotted(n.targets[0])) is not None:
                last = (dotted(n.value.func) or "").rsplit(".", 1)[-1]
                if last in _WRAPS or (last[:1].isupper() and "Optim" not in last
                                      and last not in ("Generator", "DataLoader")):
                    out.add(t)
        return out
    return ctx._cached("probe_module_names", ctx.tree, compute)  # type: ignore[no-any-return]


def _models_of(ctx: FileContext, calls: list[ast.Call], probe: ast.Call | None) -> set[str]:
    """The names called like a model in ``calls`` and in the file's functions they call (one
    level; a helper's parameter read as the name its call passes): ``model(x)``,
    ``self.model(x)``. Not a function of the file, a builtin or a library function."""
    out: set[str] = set()
    modules = _module_names(ctx)

    def add(name: str | None) -> None:
        if name and name in modules:
            out.add(name)

    for call in calls:
        add(dotted(call.func))
        fn = ctx.callee_of(call)
        if fn is None:
            continue
        params = [a.arg for a in fn.args.args]
        offset = 1 if params[:1] == ["self"] and isinstance(call.func, ast.Attribute) else 0
        given = {params[i + offset]: d for i, a in enumerate(call.args)
                 if i + offset < len(params) and (d := dotted(a))}
        for inner in _calls(fn):
            name = dotted(inner.func)
            add(given.get(name or "", name))
    return out


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
