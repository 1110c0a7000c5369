"""A loss coefficient's controller updated on every micro-step (F4): AG330.

An adaptive coefficient (the PPO/RLHF KL controller: ``loss = pg + kl_ctl.value * kl``, then
``kl_ctl.update(kl_now, n_steps)``) is a schedule of the loss, as a learning rate is one of
the optimizer. The large batch uses one coefficient per optimizer step. Updated after every
micro-batch of a window, the coefficient changes inside the window (each micro-batch's term
is weighted by another value) and the controller moves K times per optimizer step, its
horizon counted in micro-batches. Reported when the window's loss (the value its backward
receives) reads an attribute of an object whose ``update(...)`` runs on every micro-step of
that window, outside any boundary condition.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, is_backward, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["coefficient_updated_every_micro_step"]


def _loss_names(backs: list[ast.Call]) -> set[str]:
    """The names the backward calls receive (``fabric.backward(loss / K)``: ``loss``)."""
    return {n.id for b in backs for a in [*b.args, *(k.value for k in b.keywords)]
            for n in ast.walk(a) if isinstance(n, ast.Name)} | {
        n.id for b in backs if isinstance(b.func, ast.Attribute)
        for n in ast.walk(b.func.value) if isinstance(n, ast.Name)}


@rule("AG330")
def coefficient_updated_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.summed_loss:
            continue
        nodes = list(ctx.local_nodes(window))
        backs = [n for n in nodes if isinstance(n, ast.Call) and is_backward(n)]
        if not backs:
            continue
        losses = _loss_names(backs)
        coefs: dict[str, ast.Attribute] = {}
        for st in nodes:
            if isinstance(st, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in losses for t in st.targets):
                for a in ast.walk(st.value):
                    if isinstance(a, ast.Attribute) and (base := dotted(a.value)) is not None \
                            and base != "self" and not isinstance(a.ctx, ast.Store):
                        coefs.setdefault(base, a)
        if not coefs:
            continue
        for call in nodes:
            if not (isinstance(call, ast.Call) and call_attr(call) == "update"):
                continue
            owner = dotted(receiver(call))
            if owner not in coefs or ctx.guarded(call, window) \
                    or ctx.kind_of_receiver(receiver(call)) != "other":
                continue
            coef = coefs[owner]
            yield ctx.finding(
                "AG330",
                call,
                f"`{ast.unparse(call.func)}(...)` runs on every micro-batch of the window at "
                f"line {getattr(window, 'lineno', '?')}, and the loss reads `{ast.unparse(coef)}` "
                f"(line {coef.lineno}) as a coefficient: it changes inside the window, so the "
                "window's micro-batches are weighted by different values where the large batch "
                "uses one, and the controller moves K times per optimizer step",
            )
            break
