"""Clipping in a Lightning hook that runs on every batch (F8): AG138.

Lightning calls ``on_after_backward`` / ``on_before_backward`` on every batch; with
``accumulate_grad_batches`` = K > 1 the optimizer steps once per K batches, so a
``clip_grad_norm_`` (or ``self.clip_gradients``) there clips the partial sum of the window
after each micro-batch, not the window's gradient once. ``configure_gradient_clipping``,
``on_before_optimizer_step`` and ``Trainer(gradient_clip_val=...)`` run once per optimizer
step and are right. A boundary test around the call is respected; a module that steps its
own optimizers (``automatic_optimization = False``) is not judged.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import CLIP_FUNCS, FUNCS, call_attr
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import lightning_accumulates, manual_optimization

_BACKWARD_HOOKS = ("on_after_backward", "on_before_backward")


@rule("AG138")
def clip_in_backward_hook(ctx: FileContext) -> Iterator[Finding]:
    hooks = [f for f in ctx.of(*FUNCS) if f.name in _BACKWARD_HOOKS]
    if not hooks or not lightning_accumulates(ctx):
        return
    for func in hooks:
        cls = ctx.enclosing(func, (ast.ClassDef,))
        if not isinstance(cls, ast.ClassDef) or manual_optimization(cls):
            continue
        for n in ctx.local_nodes(func):
            if not (isinstance(n, ast.Call) and call_attr(n) in CLIP_FUNCS) or ctx.guarded(n, func):
                continue
            yield ctx.finding(
                "AG138",
                n,
                f"`{ast.unparse(n.func)}` in `{func.name}`: Lightning calls it on every batch, and "
                "accumulate_grad_batches > 1 makes K batches one optimizer step, so each micro-batch "
                "clips the partial sum of the window instead of the window's gradient once",
            )
