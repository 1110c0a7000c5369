"""A ``Trainer.training_step`` override that does not hand ``num_items_in_batch`` on (F5):
AG304.

The Hugging Face Trainer calls ``training_step(model, inputs, num_items_in_batch)`` with the
window's token count. An override that calls ``super().training_step(model, inputs)`` (to
change the inputs, to log) passes None: the parent then lets the model average each
micro-batch over its own tokens and divides that mean by the accumulation steps, a mean of
per-micro-batch means where the large batch divides the window's summed loss by its
tokens. Silent when the count, or ``**kwargs``, is passed on.

AG334 (F7, a warning): a ``training_step`` override dividing the loss by
``self.args.gradient_accumulation_steps``. The Trainer runs an epoch's last window with the
micro-batches left (``self.current_gradient_accumulation_steps``, which its own
``training_step`` divides by); divided by the configured K, a short last window is scaled as
if it were full. A warning: whether an epoch has such a window depends on the data's size.

AG350 (LOSS_SCALE): a ``compute_loss`` override that receives the count (``num_items_in_batch``
or ``**kwargs``) and calls ``super().compute_loss(model, inputs, ...)`` without it. The parent
then lets the model average each micro-batch over its own tokens, while ``training_step``,
which handed the count in, still counts the loss as normalised to the window and skips its
division by the accumulation steps: each micro-batch's mean weighs 1, K times the large
batch's. Silent when the model is a class of the file whose ``forward`` takes no
``**kwargs`` (the Trainer then divides by K itself), or when the file sets
``loss_is_scaled_for_ga``, ``model_accepts_loss_kwargs`` or a ``compute_loss_func``.

AG351 (LOSS_SCALE): a method of a ``Trainer`` subclass divides by
``self.accelerator.gradient_accumulation_steps`` (or through a name bound to
``self.accelerator``). The Trainer builds its Accelerator with ``num_steps = 1`` and
accumulates itself, so that value is always 1: the term meant to be divided by K is not,
and weighs K times its share. ``self.current_gradient_accumulation_steps`` is the window's K.

AG362 (F10): a ``compute_loss`` override adds to ``super().compute_loss(..., num_items_in_batch)``
a term divided by ``num_items_in_batch`` with no factor of the number of processes (a z-loss,
``(lse ** 2 * mask).sum() / num_items_in_batch``). With ``average_tokens_across_devices`` (the
default) the count is the window's over every process, and the parent multiplies its own loss
by ``num_processes`` to undo DDP's average; the added term is not, so after the average it
weighs 1/W of its coefficient. An error when the file's ``TrainingArguments`` set a ``ddp_*``
option (several processes meant), a warning otherwise.

AG368 (F13, a warning): a ``compute_loss``/``training_step`` override finding the window with
a counter of its own (``if self._micro % self.args.gradient_accumulation_steps == 0``), which
does not restart with the Trainer's per-epoch windows: off the boundaries after the first
short window. A warning (it needs an epoch that is no multiple of K); ``accumguard watch``
makes it an error when the run shows such a window.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._hftrainer import trainer_methods
from accumguard.static.lint.families._modguard import mod_term
from accumguard.static.lint.families.hfheld import _multi_process
from accumguard.static.lint.families.hfscale import _model_without_loss_kwargs, _per_rank_counts

_COUNT = "num_items_in_batch"


def _super_call(node: ast.AST, method: str = "training_step") -> bool:
    """``super().<method>(...)`` (or ``super(Cls, self)``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method and isinstance(node.func.value, ast.Call)
            and dotted(node.func.value.func) == "super")


@rule("AG304")
def training_step_drops_item_count(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "training_step"):
        if _COUNT not in {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}:
            continue
        for call in ast.walk(fn):
            if not _super_call(call):
                continue
            assert isinstance(call, ast.Call)
            passed = (len(call.args) >= 3 or any(k.arg in (_COUNT, None) for k in call.keywords)
                      or any(isinstance(a, ast.Starred) for a in call.args))
            if passed:
                continue
            yield ctx.finding(
                "AG304", call,
                f"`{ast.unparse(call)}` in `{cls.name}.training_step` drops the window's "
                f"`{_COUNT}`: the parent passes None to compute_loss, each micro-batch's loss "
                "is its own token mean, divided by the accumulation steps (a mean of "
                "per-micro-batch means)")


@rule("AG334")
def training_step_divides_by_configured_k(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "training_step"):
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                    and dotted(node.right) == "self.args.gradient_accumulation_steps":
                f = ctx.finding(
                    "AG334",
                    node,
                    f"`{cls.name}.training_step` divides the loss by "
                    "`self.args.gradient_accumulation_steps`, the configured K: an epoch whose "
                    "micro-batches are no multiple of K ends on a shorter window, which the "
                    "Trainer runs with `self.current_gradient_accumulation_steps` micro-batches; "
                    "divided by K, that window's update is scaled as if it were full")
                yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                break


def _scaling_settled(ctx: FileContext) -> bool:
    """The file decides the Trainer's loss scaling itself: it sets ``loss_is_scaled_for_ga``
    or ``(model_)accepts_loss_kwargs``, or gives a ``compute_loss_func``."""
    names = ("loss_is_scaled_for_ga", "accepts_loss_kwargs", "model_accepts_loss_kwargs")
    return any(isinstance(t, ast.Attribute | ast.Name) and (dotted(t) or "").rsplit(".", 1)[-1] in names
               for n in ctx.of(ast.Assign) for t in n.targets) \
        or any(k.arg == "compute_loss_func" for c in ctx.of(ast.Call) for k in c.keywords)


@rule("AG350")
def compute_loss_drops_item_count(ctx: FileContext) -> Iterator[Finding]:
    if _scaling_settled(ctx):
        return
    for cls, fn in trainer_methods(ctx, "compute_loss"):
        if _COUNT not in {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)} and fn.args.kwarg is None:
            continue
        if _model_without_loss_kwargs(ctx, cls) is not None:
            continue
        for call in ast.walk(fn):
            if not _super_call(call, "compute_loss"):
                continue
            assert isinstance(call, ast.Call)
            passed = (len(call.args) >= 4 or any(k.arg in (_COUNT, None) for k in call.keywords)
                      or any(isinstance(a, ast.Starred) for a in call.args))
            if passed:
                continue
            yield ctx.finding(
                "AG350", call,
                f"`{cls.name}.compute_loss` calls `super().compute_loss(...)` without the "
                f"window's `{_COUNT}`: the parent lets the model average each micro-batch over "
                "its own tokens, while training_step, which passed the count in, takes the loss "
                "as normalised to the window and skips its division by the accumulation steps: "
                "each micro-batch's mean weighs 1, the window K times the large batch's mean")
            break


def _accelerator_k(node: ast.AST, aliases: set[str]) -> bool:
    """``self.accelerator.gradient_accumulation_steps`` or ``acc.gradient_accumulation_steps``
    with ``acc`` bound to ``self.accelerator``."""
    return isinstance(node, ast.Attribute) and node.attr == "gradient_accumulation_steps" and (
        dotted(node.value) == "self.accelerator" or dotted(node.value) in aliases)


@rule("AG351")
def divides_by_trainer_accelerator_k(ctx: FileContext) -> Iterator[Finding]:
    for cls in ctx.of(ast.ClassDef):
        if not (isinstance(cls, ast.ClassDef)
                and any((dotted(b) or "").endswith("Trainer") for b in cls.bases)) or any(
                    isinstance(f, ast.FunctionDef) and f.name == "create_accelerator_and_postprocess"
                    for f in cls.body):
            continue  # (an Accelerator the subclass builds itself may hold K)
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            aliases = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)
                       and dotted(n.value) == "self.accelerator" for t in n.targets
                       if isinstance(t, ast.Name)}
            hit = next((n for n in ast.walk(fn) if isinstance(n, ast.BinOp)
                        and isinstance(n.op, ast.Div) and _accelerator_k(n.right, aliases)), None)
            if hit is None:
                continue
            yield ctx.finding(
                "AG351", hit,
                f"`{cls.name}.{fn.name}` divides by `{ast.unparse(hit.right)}`, which the "
                "Trainer's own Accelerator always holds as 1 (the Trainer builds it with "
                "num_steps = 1 and accumulates itself): this division does nothing, and the "
                "term weighs K times its share of the window")
            return


def _world_factor(ctx: FileContext, expr: ast.AST, fn: ast.AST) -> bool:
    """``expr`` (through the names ``fn`` binds) holds the number of processes."""
    todo, seen = [expr], set()
    values = ctx.assigned_in(fn)
    while todo:
        x = todo.pop()
        if ctx.mentions_world(x):
            return True
        for n in ast.walk(x):
            if isinstance(n, ast.Name) and n.id not in seen:
                seen.add(n.id)
                todo += values.get(n.id, [])
    return False


@rule("AG362")
def term_over_window_count_beside_super_loss(ctx: FileContext) -> Iterator[Finding]:
    if _per_rank_counts(ctx) or _scaling_settled(ctx):
        return
    for cls, fn in trainer_methods(ctx, "compute_loss"):
        if _COUNT not in {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)} \
                or _model_without_loss_kwargs(ctx, cls) is not None:
            continue
        supers = [n for n in ast.walk(fn) if _super_call(n, "compute_loss")]
        if not supers or not all(
                len(c.args) >= 4 or any(k.arg == _COUNT for k in c.keywords) for c in supers
                if isinstance(c, ast.Call)):
            continue
        main: set[str] = set()
        for a in ast.walk(fn):
            if isinstance(a, ast.Assign) and any(x in supers for x in ast.walk(a.value)):
                t = a.targets[0]
                first = t.elts[0] if isinstance(t, ast.Tuple) and t.elts else t
                if isinstance(first, ast.Name):
                    main.add(first.id)
        if not main:
            continue
        for add in ast.walk(fn):
            if not (isinstance(add, ast.BinOp) and isinstance(add.op, ast.Add)):
                continue
            sides = [add.left, add.right]
            if not any(isinstance(x, ast.Name) and x.id in main for x in sides):
                continue
            other = next(x for x in sides if not (isinstance(x, ast.Name) and x.id in main))
            term = _over_count(ctx, other, fn)
            if term is None or _world_factor(ctx, other, fn):
                continue
            f = ctx.finding(
                "AG362", add,
                f"`{ast.unparse(other)}` is added to the loss `super().compute_loss(...)` "
                f"returned, and it is divided by `{_COUNT}` (`{ast.unparse(term)}`), the window's "
                "count over every process (average_tokens_across_devices): the parent multiplies "
                "its own loss by num_processes to undo DDP's average, this term is not, so "
                "after the average it weighs 1/W of its coefficient")
            yield f if _multi_process(ctx) else replace(
                f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
            return


def _over_count(ctx: FileContext, expr: ast.AST, fn: ast.AST) -> ast.AST | None:
    """The division by ``num_items_in_batch`` in ``expr``, or in the one value a name of it
    is bound to in ``fn``."""
    values = ctx.assigned_in(fn)
    todo, seen = [expr], set()
    while todo:
        x = todo.pop()
        for n in ast.walk(x):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and dotted(n.right) == _COUNT:
                return n
            if isinstance(n, ast.Name) and n.id not in seen and len(values.get(n.id, [])) == 1:
                seen.add(n.id)
                todo += values[n.id]
    return None


def _own_counter_tests(fn: ast.FunctionDef) -> list[tuple[ast.If, str]]:
    """``if self.c % self.args.gradient_accumulation_steps == 0:`` in ``fn`` with ``self.c
    += 1`` in ``fn`` too: (the test, the counter)."""
    bumped = {dotted(n.target) for n in ast.walk(fn) if isinstance(n, ast.AugAssign)
              and isinstance(n.op, ast.Add) and (dotted(n.target) or "").startswith("self.")}
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.If) and (g := mod_term(n.test)) is not None \
                and g.counter in bumped and "gradient_accumulation_steps" in ast.unparse(g.modulus):
            out.append((n, g.counter))
    return out


@rule("AG368")
def trainer_override_counts_its_own_windows(ctx: FileContext) -> Iterator[Finding]:
    """AG368 (F13, a warning): a ``compute_loss``/``training_step`` override of a Trainer
    subclass tests its own micro-batch counter against ``gradient_accumulation_steps`` to act
    once per window (a per-update penalty, a log). The Trainer starts its windows again at
    every epoch (an epoch whose micro-batches are no multiple of K ends with a short window);
    the counter runs on, so from the first short window its test fires off the Trainer's
    boundaries: windows without the term, or with it twice."""
    for method in ("compute_loss", "training_step"):
        for cls, fn in trainer_methods(ctx, method):
            for test, counter in _own_counter_tests(fn):
                reset = any(isinstance(n, ast.Assign) and any(dotted(t) == counter for t in n.targets)
                            and ctx.enclosing(n, (ast.FunctionDef,)) not in (fn,)
                            and getattr(ctx.enclosing(n, (ast.FunctionDef,)), "name", "") != "__init__"
                            for n in ast.walk(cls))
                if reset:
                    continue  # set back elsewhere (an epoch callback): not judged
                f = ctx.finding(
                    "AG368", test,
                    f"`{ast.unparse(test.test)}` finds the window with the override's own counter "
                    f"`{counter}`, which runs on across epochs, while the Trainer starts its windows "
                    "again at every epoch (a short last window when an epoch's micro-batches are "
                    "no multiple of K): from the first short window the test fires off the "
                    "Trainer's boundaries",
                    fix="test the Trainer's own step: act when `self.state.global_step` differs "
                        "from the step you last acted on")
                yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                return
