"""The DeepSpeed boundary flag read after ``engine.step()`` (F4): AG315.

``engine.is_gradient_accumulation_boundary()`` answers for the micro-step about to run: it is
true when the engine's micro-step counter plus one is a multiple of the engine's GA.
``engine.step()`` moves that counter on, so a flag read after it, in the same iteration,
answers for the next micro-batch: with GA > 1 it is true on the micro-batch before each
boundary. A scheduler stepped under it steps one micro-batch before each optimizer step, so
every update runs at the next update's rate (the first one's warm-up step is skipped).
Silent when the flag is read before ``engine.step()`` (DeepSpeed's own idiom), when the
config's GA is 1, when what the flag gates is no scheduler, and when the engine steps that
scheduler itself (AG153).

AG329 (F13): the same late flag gating a checkpoint (``engine.save_checkpoint``): it is taken
on the micro-batch before each boundary, inside the window. DeepSpeed saves the weights and
the optimizer, not a window's gradients half accumulated, so a run resumed from it loses the
gradients of the window's first K - 1 micro-batches, and its windows no longer line up with
the data (the resumed engine counts its micro-steps anew).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.dssched import _engine_schedulers

__all__ = ["boundary_flag_after_engine_step", "checkpoint_on_late_boundary_flag"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _ds_ga(ctx: FileContext) -> tuple[int | None, bool]:
    """The config's GA when a number is in sight, and whether the config builds its batch
    sizes from an accumulation count (``train_batch_size: micro * grad_accum * world``)."""
    ref = ctx.ds_config()
    if ref is None:
        return None, False
    if ref.ga is not None:
        return ref.ga, ref.ga > 1
    node = getattr(ref, "node", None)
    built = isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value in ("gradient_accumulation_steps", "train_batch_size")
        and ctx.mentions_accum(v) for k, v in zip(node.keys, node.values, strict=True))
    return None, built


def _if_testing(ctx: FileContext, node: ast.AST) -> ast.If | None:
    """The ``if`` statement whose condition holds ``node``."""
    child, parent = node, ctx.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        child, parent = parent, ctx.parents.get(parent)
    return parent if isinstance(parent, ast.If) and child is parent.test else None


def _late_flags(ctx: FileContext) -> Iterator[tuple[ast.Call, str, ast.If, ast.Call]]:
    """(flag, engine, the ``if`` it tests, the ``engine.step()`` before it) for every boundary
    flag read after the engine stepped in the same loop iteration."""
    for flag in ctx.of(ast.Call):
        if call_attr(flag) != "is_gradient_accumulation_boundary" \
                or (engine := dotted(receiver(flag))) is None:
            continue
        test = _if_testing(ctx, flag)
        if test is None:
            continue
        loop = ctx.enclosing(test, _LOOPS)
        if loop is None:
            continue
        stepped = [c for c in ast.walk(loop) if isinstance(c, ast.Call) and call_attr(c) == "step"
                   and dotted(receiver(c)) == engine and not c.args
                   and (c.lineno, c.col_offset) < (test.lineno, test.col_offset)
                   and ctx.enclosing(c, _LOOPS) is loop]
        if stepped:
            yield flag, engine, test, stepped[0]


def _graded(ctx: FileContext, f: Finding) -> Finding:
    """An error when the config's GA is in sight (> 1) or built from an accumulation count;
    a low-confidence warning otherwise."""
    ga, built = _ds_ga(ctx)
    return f if (ga is not None or built) else replace(
        f, severity=Severity.WARNING, confidence=Confidence.LOW)


@rule("AG315")
def boundary_flag_after_engine_step(ctx: FileContext) -> Iterator[Finding]:
    ga, _ = _ds_ga(ctx)
    if ga == 1:
        return
    owned = {name for _, name, _ in _engine_schedulers(ctx)}
    for flag, engine, test, stepped in _late_flags(ctx):
        scheds = [c for s in test.body for c in ast.walk(s) if isinstance(c, ast.Call)
                  and call_attr(c) == "step" and ctx.kind_of_receiver(receiver(c)) == "scheduler"]
        if not scheds:
            continue
        if any(dotted(receiver(c)) in owned for c in scheds):
            continue  # the engine steps that scheduler itself: AG153 says so
        name = dotted(receiver(scheds[0])) or "scheduler"
        yield _graded(ctx, ctx.finding(
            "AG315",
            flag,
            f"`{engine}.is_gradient_accumulation_boundary()` is read after `{engine}.step()` "
            f"(line {stepped.lineno}) moved the engine's micro-step counter: it answers for "
            f"the next micro-batch, true on the one before each boundary, so `{name}.step()` "
            "under it runs one micro-batch before each optimizer step and every update uses "
            "the next update's learning rate"
            + (f" (GA = {ga})" if ga is not None else ""),
        ))


_SAVES = ("save_checkpoint", "save")


@rule("AG329")
def checkpoint_on_late_boundary_flag(ctx: FileContext) -> Iterator[Finding]:
    ga, _ = _ds_ga(ctx)
    if ga == 1:
        return
    for flag, engine, test, stepped in _late_flags(ctx):
        saves = [c for s in test.body for c in ast.walk(s) if isinstance(c, ast.Call)
                 and call_attr(c) in _SAVES]
        if not saves:
            continue
        yield _graded(ctx, ctx.finding(
            "AG329",
            flag,
            f"`{engine}.is_gradient_accumulation_boundary()` is read after `{engine}.step()` "
            f"(line {stepped.lineno}) moved the engine's micro-step counter: it is true on the "
            f"micro-batch before each boundary, so the checkpoint under it (line "
            f"{saves[0].lineno}) is taken inside a window, with the window's gradients not yet "
            "applied and not saved: a run resumed from it loses the gradients of that window's first "
            "micro-batches, and its windows no longer line up with the data (the resumed "
            "engine counts its micro-steps anew)"
            + (f" (GA = {ga})" if ga is not None else ""),
        ))
