"""Accelerate's micro-batch counter read as the optimizer's step (F4): AG367.

``Accelerator.step`` is the counter ``accumulate()`` advances on every micro-batch to decide
the boundary (``step % gradient_accumulation_steps == 0``), set back to 0 at the end of each
prepared loader. A learning rate computed from it (``group["lr"] = warmup(accelerator.step)``,
``lr = base * min(1, accelerator.step / warmup)``, ``sched.step(accelerator.step)``) moves K times per optimizer step and starts again every
epoch: the schedule the optimizer follows is neither the one written nor monotone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.accelerate import accelerator_ks

__all__ = ["accelerator_step_read_as_optimizer_step"]

#: a name holding a learning rate (`lr = ...`, `cur_lr`, `learning_rate`)
_RATE = re.compile(r"(^|_)lr$|learning_rate", re.IGNORECASE)


def _sets_rate(ctx: FileContext, node: ast.AST) -> ast.AST | None:
    """The statement or call through which ``node`` sets a learning rate: an assignment to
    ``...["lr"]`` / ``.lr`` holding it, or a scheduler's ``step(...)`` given it."""
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, ast.stmt):
        if isinstance(cur, ast.Call) and call_attr(cur) == "step" and cur.args:
            return cur  # `sched.step(accelerator.step)`: an epoch/step argument
        cur = ctx.parents.get(cur)
    if isinstance(cur, ast.Assign | ast.AugAssign):
        targets = cur.targets if isinstance(cur, ast.Assign) else [cur.target]
        for t in targets:
            if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                    and t.slice.value in ("lr", "learning_rate")) \
                    or (isinstance(t, ast.Attribute) and t.attr in ("lr", "learning_rate")) \
                    or (isinstance(t, ast.Name) and _RATE.search(t.id)):
                return cur
    return None


@rule("AG367")
def accelerator_step_read_as_optimizer_step(ctx: FileContext) -> Iterator[Finding]:
    ks = accelerator_ks(ctx)
    known = {k for k in ks if k is not None}
    if not ks or (known and max(known) <= 1 and None not in ks):
        return  # no accumulation: the counter still restarts each epoch, no F4 of K
    for node in walk_all(ctx.tree):
        if not isinstance(node, ast.Attribute) or node.attr != "step" \
                or not ctx.is_accelerator(node.value):
            continue
        parent = ctx.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            continue  # `accelerator.step()` does not exist; a method of another object
        site = _sets_rate(ctx, node)
        if site is None:
            continue
        f = ctx.finding(
            "AG367",
            node,
            f"`{ast.unparse(node)}` sets the learning rate (line {getattr(site, 'lineno', '?')}), but it is "
            "Accelerate's micro-batch counter (it moves on every `accumulate()` and is set back "
            "to 0 at the end of each prepared loader), not the number of optimizer steps: the "
            "schedule moves K times per update and starts again every epoch")
        error = bool(known) and None not in ks and min(known) > 1
        yield f if error else replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        return
