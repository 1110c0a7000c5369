"""The accumulation steps divided by the world size down to one (F1): AG335.

nanoGPT's train.py keeps its accumulation count for the whole job (``gradient_accumulation_steps
= 5 * 8``) and divides it by the processes (``gradient_accumulation_steps //= ddp_world_size``)
so each rank runs its share. A script that sets a per-rank count there (2, 3) and keeps the
division runs K = 2 // 2 = 1 on two ranks: the loop steps after every micro-batch, the
accumulation the script asks for never happens (and on more ranks than K, K = 0). Reported
when the count's one literal value is below twice the smallest world that divides it away (it
is 1 or less on every run of two ranks or more); an error.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import ACCUM_RE, WORLD_RE, dotted, last_part
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["accumulation_divided_by_world_to_one"]


def _divided_by_world(node: ast.AST) -> tuple[str, ast.AST] | None:
    """(the count's name, the world) for ``k //= world`` or ``k = k // world``."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.FloorDiv | ast.Div):
        target, world = dotted(node.target), node.value
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
            and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.FloorDiv) \
            and dotted(node.value.left) == dotted(node.targets[0]):
        target, world = dotted(node.targets[0]), node.value.right
    else:
        return None
    name = dotted(world)
    if target is None or name is None or not ACCUM_RE.search(last_part(target).lower()) \
            or not WORLD_RE.search(last_part(name)):
        return None
    return target, world


@rule("AG335")
def accumulation_divided_by_world_to_one(ctx: FileContext) -> Iterator[Finding]:
    for node in ctx.of(ast.AugAssign, ast.Assign):
        found = _divided_by_world(node)
        if found is None:
            continue
        name, world = found
        literals = [v for v in ctx.values_by_name().get(name, [])
                    if not (isinstance(v, ast.BinOp) and dotted(v.left) == name)]
        if len(literals) != 1 or not (isinstance(literals[0], ast.Constant)
                                      and type(literals[0].value) is int):
            continue
        k = literals[0].value
        if not 1 < k < 4:
            continue
        yield ctx.finding(
            "AG335",
            node,
            f"`{name}` is {k} (line {literals[0].lineno}) and divided by "
            f"`{ast.unparse(world)}` here: on 2 ranks or more it is 1 or 0, so the run does "
            f"not accumulate and the optimizer steps after every micro-batch; "
            f"{k} reads as a count per rank, while this division expects one for the whole job",
        )
