"""AG163 (F4): a learning rate computed from Lightning's ``global_step`` in manual
optimisation with several optimizers.

With ``automatic_optimization = False`` Lightning advances ``trainer.global_step`` on every
``optimizer.step()`` of every optimizer it handed out: a ``training_step`` that steps N
optimizers per update advances it N per update. A warm-up or decay written by hand from
``self.trainer.global_step`` (or ``self.global_step``) and set into the optimizers'
``param_groups`` then runs N times ahead of the updates (a schedule of S updates ends after
S / N). Reported when the module sets ``automatic_optimization = False``, its
``configure_optimizers`` returns a literal list or tuple of N >= 2 optimizers, and a method
stepping optimizers reads ``global_step`` undivided and writes a learning rate
(``group["lr"] = ...``). A warning: a schedule meant per optimizer call is legal, if rare.

AG186 (F14): in automatic optimisation Lightning calls ``optimizer_step`` once per window of
``accumulate_grad_batches`` batches. An override that calls ``optimizer.step(...)`` only under
an ``if`` testing a modulo (``if self.calls % k == 0``), and otherwise just runs the closure,
gates the step a second time: it steps every m-th window, and the gradient of the windows in
between is cleared by Lightning's ``zero_grad`` at the first batch of the next window.
Reported when the file's Trainer is given ``accumulate_grad_batches`` (other than a literal 1).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import (
    accumulation_given,
    automatic_lightning_module,
)

__all__ = ["global_step_schedule_with_several_optimizers", "optimizer_step_gated_again"]


def _manual(cls: ast.ClassDef) -> bool:
    return any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
               and n.value.value is False and any(
                   dotted(t) == "self.automatic_optimization" for t in n.targets)
               for n in ast.walk(cls))


def _optimizer_count(cls: ast.ClassDef) -> int:
    """The optimizers ``configure_optimizers`` returns as one literal list or tuple (0 when
    it is not that)."""
    fn = next((f for f in cls.body if isinstance(f, FUNCS) and f.name == "configure_optimizers"), None)
    if fn is None:
        return 0
    rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    if len(rets) != 1 or not isinstance(rets[0], ast.List | ast.Tuple):
        return 0
    return len(rets[0].elts)


def _undivided_global_step(fn: ast.AST) -> ast.Attribute | None:
    """A read of ``self.trainer.global_step`` / ``self.global_step`` not divided (by ``/`` or
    ``//``) where it is read."""
    parents = {c: p for p in ast.walk(fn) for c in ast.iter_child_nodes(p)}
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and n.attr == "global_step" and isinstance(n.ctx, ast.Load) \
                and dotted(n) in ("self.trainer.global_step", "self.global_step"):
            up = parents.get(n)
            if isinstance(up, ast.BinOp) and up.left is n and isinstance(up.op, ast.Div | ast.FloorDiv):
                continue
            return n
    return None


def _sets_lr(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "lr"
        for t in n.targets) for n in ast.walk(fn))


@rule("AG163")
def global_step_schedule_with_several_optimizers(ctx: FileContext) -> Iterator[Finding]:
    for cls in ctx.of(ast.ClassDef):
        n = _optimizer_count(cls)
        if n < 2 or not _manual(cls):
            continue
        for fn in (f for f in cls.body if isinstance(f, FUNCS)):
            read = _undivided_global_step(fn)
            if read is None or not _sets_lr(fn) or not any(
                    isinstance(c, ast.Call) and call_attr(c) == "step" for c in ast.walk(fn)):
                continue
            yield ctx.finding(
                "AG163",
                read,
                f"`{dotted(read)}` sets the learning rate in `{fn.name}()` of a module in manual "
                f"optimisation whose configure_optimizers returns {n} optimizers: Lightning "
                "advances global_step on every optimizer.step() of each, so it counts "
                f"{n} per update when all {n} step together and the schedule runs {n}x ahead",
            )
            break




@rule("AG186")
def optimizer_step_gated_again(ctx: FileContext) -> Iterator[Finding]:
    if not accumulation_given(ctx):
        return
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "optimizer_step" or not automatic_lightning_module(ctx, fn):
            continue
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and call_attr(call) == "step"):
                continue
            gate = ctx.enclosing(call, (ast.If,))
            if not isinstance(gate, ast.If) or ctx.enclosing(gate, FUNCS) is not fn \
                    or not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                               for n in ast.walk(gate.test)):
                continue
            yield ctx.finding(
                "AG186",
                call,
                f"`{ast.unparse(call)}` runs only when `{ast.unparse(gate.test)}`, inside an "
                "optimizer_step override that Lightning calls once per window of "
                "accumulate_grad_batches batches: the step is gated twice, so the optimizer "
                "steps every few windows on the last window's gradient only (Lightning clears "
                "the gradient at each window's first batch)",
            )
            return
