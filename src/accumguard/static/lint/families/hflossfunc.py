"""A Hugging Face ``compute_loss_func`` that never reads ``num_items_in_batch`` (LOSS_SCALE):
AG336.

The Trainer treats a ``compute_loss_func`` as normalising the loss by the window's count
(``num_items_in_batch``, summed over the micro-steps and the processes): it skips its own
division by the accumulation steps and, with ``average_tokens_across_devices`` (the default),
multiplies by the processes to undo DDP's average. A function that returns a mean over its
own micro-batch instead (``loss[mask].mean()``, ``F.cross_entropy(...)``) then weighs K x W
times the large batch's mean. Reported when the function (a ``def`` of the file, one made by a
factory of the file, or a lambda) takes a third parameter, or none, and never reads it, while
the file's ``gradient_accumulation_steps`` is above 1 (a warning when it is not in sight).

AG338 (F10): the function multiplies its loss by the world size itself (an Accelerate recipe's
``* num_processes`` ported over): the Trainer multiplies by the processes again, so the
update is W times the large batch's.

AG379 (LOSS_SCALE): the function (or a Trainer subclass's ``compute_loss``) divides a token
sum by ``num_items_in_batch`` but skips other tokens than the Trainer counts: its loss call
says ``ignore_index=PAD_ID`` while the Trainer's count is of the labels that are not -100 (and
the function does not map -100 to that id itself).
Positions labelled with the pad id are then in the denominator and not in the sum: each
window's loss is scaled down by its own share of padding (a different factor per window,
so no learning rate undoes it). An error when the file fills a tensor with that id (the
collator's padding); a warning when the source does not show labels carrying it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, WORLD_RE, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["compute_loss_func_ignores_count", "compute_loss_func_times_world", "count_skips_other_tokens"]

Func = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _resolve(ctx: FileContext, value: ast.AST) -> Func | None:
    """The function ``value`` names: a lambda, a function of the file, or the nested
    function a factory of the file returns (``make_focal_loss(gamma)``)."""
    if isinstance(value, ast.Lambda):
        return value
    if isinstance(value, ast.Name):
        defs = ctx.defs_by_name().get(value.id, [])
        return defs[0] if len(defs) == 1 else None
    if isinstance(value, ast.Call) and isinstance(factory := ctx.callee_of(value), FUNCS):
        returned = [r.value for r in ast.walk(factory) if isinstance(r, ast.Return)
                    and isinstance(r.value, ast.Name)]
        inner = {f.name: f for f in factory.body if isinstance(f, FUNCS)}
        made = [inner[r.id] for r in returned if r.id in inner]
        return made[0] if len(made) == 1 else None
    return None


def _loss_funcs(ctx: FileContext) -> Iterator[tuple[ast.AST, Func]]:
    """(the ``compute_loss_func=`` argument, the function it names) of every Trainer built in
    the file whose function the file defines."""
    for call in ctx.of(ast.Call):
        if not (dotted(call.func) or "").rsplit(".", 1)[-1].endswith("Trainer"):
            continue
        given = next((k.value for k in call.keywords if k.arg == "compute_loss_func"), None)
        fn = _resolve(ctx, given) if given is not None else None
        if given is not None and fn is not None:
            yield given, fn


def _ignores_count(fn: Func) -> str | None:
    """The count's parameter name when ``fn`` never reads it ('' when it has none)."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if fn.args.vararg is not None or fn.args.kwarg is not None:
        return None  # (**kwargs may carry it on)
    name = next((p for p in params if p == "num_items_in_batch"), params[2] if len(params) > 2 else "")
    body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
    if name and any(isinstance(n, ast.Name) and n.id == name for b in body for n in walk_all(b)):
        return None
    return name


@rule("AG336")
def compute_loss_func_ignores_count(ctx: FileContext) -> Iterator[Finding]:
    for given, fn in _loss_funcs(ctx):
        if (param := _ignores_count(fn)) is None:
            continue
        ga, how = ctx.trainer_ga()
        if ga == 1:
            continue
        where = "the lambda" if isinstance(fn, ast.Lambda) else f"`{fn.name}`"
        f = ctx.finding(
            "AG336",
            given,
            f"{where} (line {fn.lineno}) is the Trainer's compute_loss_func but never reads "
            + (f"`{param}`" if param else "the window's count (no num_items_in_batch parameter)")
            + ": the Trainer takes such a loss as normalised by the window's count, skips its "
            "division by the accumulation steps and multiplies by the processes, so a mean "
            "over each micro-batch weighs K x W times the large batch's mean"
            + (f" ({how})" if ga is not None else ""),
        )
        yield f if ga is not None else replace(f, severity=Severity.WARNING,
                                               confidence=Confidence.LOW)


def _world_factor(ctx: FileContext, fn: Func) -> ast.AST | None:
    """A multiplication by the world size in ``fn``'s returned loss (``* world_size()``,
    ``* dist.get_world_size()``, ``* accelerator.num_processes``)."""
    body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else [
        r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    for b in body:
        for n in walk_all(b):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
                for side in (n.left, n.right):
                    name = dotted(side.func) if isinstance(side, ast.Call) else dotted(side)
                    if name and WORLD_RE.search(last_part(name)):
                        return side
    return None


@rule("AG338")
def compute_loss_func_times_world(ctx: FileContext) -> Iterator[Finding]:
    for _, fn in _loss_funcs(ctx):
        factor = _world_factor(ctx, fn)
        if factor is None:
            continue
        where = "the lambda" if isinstance(fn, ast.Lambda) else f"`{fn.name}`"
        yield ctx.finding(
            "AG338",
            factor,
            f"{where}, the Trainer's compute_loss_func, multiplies its loss by the world size "
            f"(`{ast.unparse(factor)}`), and the Trainer multiplies a compute_loss_func's loss "
            "by the processes itself (average_tokens_across_devices, its default) to undo DDP's "
            "average: the update is W times the large batch's",
        )


def _counted_losses(ctx: FileContext) -> Iterator[Func]:
    """The Trainer's loss functions that read ``num_items_in_batch``: a ``compute_loss_func``
    of the file, or ``compute_loss`` of a Trainer subclass."""
    for _, fn in _loss_funcs(ctx):
        yield fn
    for cls in ctx.of(ast.ClassDef):
        if any((dotted(b) or "").endswith("Trainer") for b in cls.bases):
            yield from (f for f in cls.body
                        if isinstance(f, ast.FunctionDef) and f.name == "compute_loss")


def _other_ignore_index(ctx: FileContext, fn: Func) -> ast.AST | None:
    """The ``ignore_index=`` of a loss call in ``fn`` that is not -100, when ``fn`` reads
    ``num_items_in_batch``."""
    nodes = list(walk_all(fn))
    if not any(isinstance(n, ast.Name) and n.id == "num_items_in_batch" for n in nodes) or any(
            isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and isinstance(n.operand, ast.Constant)
            and n.operand.value == 100 for n in nodes):
        return None  # (a function that maps -100 itself, `labels[labels == -100] = pad_id`)
    for n in nodes:
        if not isinstance(n, ast.Call):
            continue
        given = next((k.value for k in n.keywords if k.arg == "ignore_index"), None)
        if given is None:
            continue
        value = ctx.int_value(given)
        if (value is not None and value != -100) or (value is None and "pad" in ast.unparse(given).lower()):
            return given
    return None


_FILLS = frozenset({"full", "new_full", "full_like", "pad"})


def _fills_with(ctx: FileContext, value: ast.AST) -> ast.Call | None:
    """A call of the file filling a tensor with ``value`` (``torch.full(shape, PAD_ID)``,
    ``ids.new_full(shape, pad_id)``, ``F.pad(x, (0, n), value=PAD_ID)``)."""
    text = ast.unparse(value)
    for c in ctx.of(ast.Call):
        if not isinstance(c, ast.Call) or (dotted(c.func) or "").rsplit(".", 1)[-1] not in _FILLS:
            continue
        if any(ast.unparse(a) == text for a in (*c.args[1:], *(k.value for k in c.keywords
                                                               if k.arg in ("fill_value", "value")))):
            return c
    return None


@rule("AG379")
def count_skips_other_tokens(ctx: FileContext) -> Iterator[Finding]:
    for fn in _counted_losses(ctx):
        skipped = _other_ignore_index(ctx, fn)
        if skipped is None:
            continue
        fill = _fills_with(ctx, skipped)
        where = "the lambda" if isinstance(fn, ast.Lambda) else f"`{fn.name}`"
        f = ctx.finding(
            "AG379",
            skipped,
            f"{where} divides its loss by num_items_in_batch, which the Trainer counts as the "
            f"labels that are not -100, but its loss skips `ignore_index={ast.unparse(skipped)}`"
            + (f", the value the file pads with (line {fill.lineno})" if fill is not None else "")
            + ": those positions are counted and not summed, so each window's loss is scaled "
            "down by its own share of them, a different factor per window",
        )
        yield f if fill is not None else replace(f, severity=Severity.WARNING)
        return
