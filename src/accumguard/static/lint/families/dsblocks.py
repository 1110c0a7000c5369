"""One ``engine.coalesce_grad_reduction()`` block per micro-step (F2): AG303.

DeepSpeed's ``coalesce_grad_reduction()`` is one block per optimizer step: the backwards
inside it leave their gradients on the parameters and the block's exit flushes one reduction
that writes the reduced gradients afresh. A block entered inside the micro-step loop around
a single backward, with the optimizer step after the loop, flushes once per micro-step and
each flush overwrites the previous one: only the last micro-batch reaches the step. Silent
when the loop itself steps the engine after the block (a block per step, GA 1).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _coalescing(item: ast.withitem) -> bool:
    e = item.context_expr
    return isinstance(e, ast.Call) and call_attr(e) == "coalesce_grad_reduction"


@rule("AG303")
def coalesced_block_per_micro_step(ctx: FileContext) -> Iterator[Finding]:
    for with_ in ctx.of(ast.With):
        if not any(_coalescing(i) for i in with_.items):
            continue
        inner = [n for n in ast.walk(with_) if n is not with_]
        if any(isinstance(n, _LOOPS) for n in inner):
            continue  # a loop of backwards inside the block: the window's block
        if not any(isinstance(n, ast.Call) and call_attr(n) == "backward" for n in inner):
            continue
        loop = ctx.enclosing(with_, _LOOPS)
        if not isinstance(loop, _LOOPS) or ctx.enclosing(with_, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda)) is not ctx.enclosing(
                loop, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if any(isinstance(n, ast.Call) and call_attr(n) == "step" for n in ast.walk(loop)):
            continue  # the loop steps after each block: a block per step
        yield ctx.finding(
            "AG303", with_,
            "`with ...coalesce_grad_reduction():` around one backward inside the micro-step "
            f"loop (line {loop.lineno}), with the step after the loop: each block's exit "
            "flushes a reduction that overwrites the previous one, so only the last "
            "micro-batch reaches the optimizer",
        )
