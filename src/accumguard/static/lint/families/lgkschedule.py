"""A schedule horizon read from ``trainer.estimated_stepping_batches`` under Lightning's
``GradientAccumulationScheduler`` (F4): AG302.

Lightning runs ``configure_optimizers`` before the first epoch begins; the callback sets the
Trainer's ``accumulate_grad_batches`` at each epoch's start, so ``estimated_stepping_batches``
read there is computed with the Trainer's own K (1: Lightning refuses both at once) and
counts every batch as an optimizer step. A step-interval schedule sized from it ends
several times late (the run makes sum over epochs of ceil(batches / that epoch's K) steps).
Silent when the function that reads it also reads the callback's schedule
(``get_accumulate_grad_batches``, ``scheduling``) or any K, i.e. corrects the count itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lghorizon import _HORIZON_CTORS

_SCHEDULER = "GradientAccumulationScheduler"
#: names whose presence in the function means it reads K per epoch itself
_READS_K = ("get_accumulate_grad_batches", "scheduling", "accumulate_grad_batches")


def _tail(node: ast.AST) -> str:
    return (dotted(node) or "").rsplit(".", 1)[-1]


def _scope_facts(ctx: FileContext, scope: ast.AST) -> tuple[bool, bool]:
    """(the scope reads K itself, the scope builds a schedule), once per scope."""
    nodes = list(walk_all(scope))
    names = {n.attr if isinstance(n, ast.Attribute) else n.id
             for n in nodes if isinstance(n, ast.Attribute | ast.Name)}
    reads_k = any(r in names for r in _READS_K) or any(
        ctx.mentions_accum(n) for n in nodes if isinstance(n, ast.Name))
    sizes = any(isinstance(c, ast.Call) and _tail(c.func) in _HORIZON_CTORS for c in nodes)
    return reads_k, sizes


@rule("AG302")
def horizon_from_stepping_batches_under_k_schedule(ctx: FileContext) -> Iterator[Finding]:
    if not any(_tail(c.func) == _SCHEDULER for c in ctx.of(ast.Call)):
        return
    for node in ast.walk(ctx.tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "estimated_stepping_batches"):
            continue
        scope = ctx.scope_of(node)
        reads_k, sizes = ctx._cached("lgk_scope", scope, lambda scope=scope: _scope_facts(ctx, scope))
        if reads_k:
            continue  # the count is corrected with the schedule's K in sight
        if not sizes:
            continue  # not sizing a schedule here
        yield ctx.finding(
            "AG302", node,
            f"`{ast.unparse(node)}` sizes a schedule in a file whose Trainer runs a "
            f"`{_SCHEDULER}`: Lightning reads it before the first epoch, before the callback "
            "has set K (the Trainer's own accumulate_grad_batches, 1), so it counts every "
            "batch as an optimizer step and the schedule ends several times late",
        )
