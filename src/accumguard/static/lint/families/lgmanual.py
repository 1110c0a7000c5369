"""AG115 (F13) in Lightning's manual optimisation: ``if batch_idx % K == 0:`` steps after
the backward of batch 0.

With ``automatic_optimization = False`` the ``training_step`` accumulates by hand: it calls
``self.manual_backward`` on every batch and steps its optimizers every K batches. Lightning
counts ``batch_idx`` from 0 in every epoch, so a step gated by ``batch_idx % K == 0`` after
the backward fires on the first batch: the first window holds one micro-batch, every later
one is shifted by one, and an epoch's last K - 1 batches are carried into the next epoch.
The right gate is ``(batch_idx + 1) % K == 0``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, position, receiver, walk_local
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import manual_optimization
from accumguard.static.lint.families._modguard import mod_guard

__all__ = ["lightning_manual_batch_idx_off_by_one"]


@rule("AG115")
def lightning_manual_batch_idx_off_by_one(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or len(fn.args.args) < 3:
            continue
        cls = ctx.enclosing(fn, (ast.ClassDef,))
        if not isinstance(cls, ast.ClassDef) or not manual_optimization(cls):
            continue
        batch_idx = fn.args.args[2].arg  # (self, batch, batch_idx)
        backwards = [c for c in walk_local(fn) if isinstance(c, ast.Call)
                     and call_attr(c) in ("manual_backward", "backward")]
        for node in walk_local(fn):
            if not isinstance(node, ast.If):
                continue
            guard = mod_guard(node.test)
            if (guard is None or guard.counter != batch_idx or guard.offset != 0
                    or guard.residue or guard.excludes_zero):
                continue
            steps = [c for s in node.body for c in walk_local(s)
                     if isinstance(c, ast.Call) and call_attr(c) == "step"
                     and ("opt" in (dotted(receiver(c)) or "").lower()
                          or ctx.kind_of_receiver(receiver(c)) == "optimizer")]
            if not steps or not any(position(b) < position(node) for b in backwards):
                continue
            yield ctx.finding(
                "AG115",
                node,
                f"`{ast.unparse(node.test)}` gates the optimizer step after this batch's "
                f"manual_backward, and Lightning counts `{batch_idx}` from 0 in every epoch: the "
                "first window holds 1 batch, every later one is shifted by one, and an epoch's "
                "last K - 1 batches are carried into the next epoch",
                fix=f"step when `({batch_idx} + 1) % K == 0` (and on the epoch's last batch)",
            )
