"""nanoGPT's tokens per iteration without the world size, sizing a schedule (F4): AG308.

nanoGPT divides the global accumulation count by the world size
(``gradient_accumulation_steps //= ddp_world_size``): each rank then runs its share, and one
optimizer step sees ``steps * world_size * batch_size * block_size`` tokens. A
``tokens_per_iter`` written without the world size counts one rank's share only; an
iteration count derived from it (``lr_decay_iters = decay_tokens // tokens_per_iter``) is
``world_size`` times too large, and the schedule ends that many times late.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule


def _accum_divided_by_world(ctx: FileContext) -> str | None:
    """The name the file divides by the world size and that names accumulation steps."""
    for n in ctx.of(ast.Assign, ast.AugAssign):
        value = n.value
        target = n.target if isinstance(n, ast.AugAssign) else (
            n.targets[0] if len(n.targets) == 1 else None)
        name = dotted(target) if target is not None else None
        if name is None or target is None or not ctx.mentions_accum(target):
            continue
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.FloorDiv | ast.Div) \
                and ctx.mentions_world(value):
            return name
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.FloorDiv | ast.Div) \
                and ctx.mentions_world(value.right):
            return name
    return None


@rule("AG308")
def tokens_per_iter_without_world(ctx: FileContext) -> Iterator[Finding]:
    accum = _accum_divided_by_world(ctx)
    if accum is None:
        return
    for n in ctx.of(ast.Assign):
        if len(n.targets) != 1 or not isinstance(n.targets[0], ast.Name) \
                or "token" not in n.targets[0].id.lower():
            continue
        value = n.value
        names = {dotted(x) for x in ast.walk(value) if isinstance(x, ast.Name | ast.Attribute)}
        if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)) \
                or accum not in names or ctx.mentions_world(value):
            continue
        per = n.targets[0].id
        for use in ctx.of(ast.Assign):
            if len(use.targets) != 1 or not isinstance(use.value, ast.BinOp) \
                    or not isinstance(use.value.op, ast.FloorDiv | ast.Div) \
                    or dotted(use.value.right) != per:
                continue
            target = dotted(use.targets[0]) or "?"
            if not any(w in target.lower() for w in ("iter", "step", "horizon")):
                continue
            yield ctx.finding(
                "AG308", use,
                f"`{target}` is counted with `{per}` (line {n.lineno}), which multiplies the "
                f"per-rank `{accum}` (divided by the world size) without the world size: one "
                f"optimizer step sees world_size times `{per}` tokens, so `{target}` is "
                "world_size times too many steps and the schedule ends that many times late")
