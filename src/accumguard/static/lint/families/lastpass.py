"""A list of gradients rebuilt on every pass of a loop and reduced after it (F10): AG320.

A hand-written all-reduce that gathers the gradients per parameter group —
``for group in optimizer.param_groups: grads = [p.grad for p in group["params"]]`` — and
reduces after the loop (``dist.all_reduce(flatten(grads))``) reduces only the last pass's
list: the assignment replaced the earlier groups' lists, whose parameters each rank then
steps on its own gradient. Reported when a name is assigned (not extended) inside a
``for`` loop from a value that reads ``.grad`` and the loop's item, nothing inside the loop
reads it, and after the loop a collective receives it (directly or through one name
assigned from it). Silent when the list is extended (``grads += ...``,
``grads.extend(...)``) or the reduction runs inside the loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["gradients_of_the_last_pass_reduced"]

_COLLECTIVES = {"all_reduce", "all_reduce_coalesced", "reduce", "all_reduce_multigpu",
                "reduce_scatter", "all_gather", "broadcast"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk_all(node) if isinstance(n, ast.Name)}


def _reads_grad(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in walk_all(node))


@rule("AG320")
def gradients_of_the_last_pass_reduced(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(*FUNCS):
        body = list(ctx.local_nodes(fn))
        for loop in (n for n in body if isinstance(n, ast.For | ast.AsyncFor)):
            item = _names(loop.target)
            end = int(getattr(loop, "end_lineno", loop.lineno))
            inside = [n for n in walk_all(loop) if n is not loop]
            for a in (n for n in inside if isinstance(n, ast.Assign) and len(n.targets) == 1):
                target = a.targets[0]
                if not isinstance(target, ast.Name):
                    continue
                name = target.id
                if not (_reads_grad(a.value) and _names(a.value) & item):
                    continue
                if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                       for n in inside) or any(
                        isinstance(n, ast.AugAssign) and _names(n.target) == {name} for n in body):
                    continue  # used or extended in the loop: not a list replaced per pass
                after = [n for n in body if int(getattr(n, "lineno", 0)) > end]
                carried = {name} | {t.id for n in after if isinstance(n, ast.Assign)
                                    and name in _names(n.value)
                                    for t in n.targets if isinstance(t, ast.Name)}
                coll = next((c for c in after if isinstance(c, ast.Call)
                             and call_attr(c) in _COLLECTIVES
                             and any(_names(x) & carried for x in c.args)), None)
                if coll is None:
                    continue
                yield ctx.finding(
                    "AG320", a,
                    f"`{name}` is assigned anew on every pass of the loop over "
                    f"`{ast.unparse(loop.iter)}` (line {loop.lineno}) and reduced after it "
                    f"(`{ast.unparse(coll.func)}` at line {coll.lineno}): only the last pass's "
                    "gradients are averaged over the ranks; the earlier passes' parameters "
                    "step on each rank's own gradient")
                break
