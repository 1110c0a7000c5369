"""Clipping in a framework hook that runs on every micro-batch (F8): AG138.

Lightning calls ``on_after_backward`` / ``on_before_backward`` on every batch; with
``accumulate_grad_batches`` = K > 1 the optimizer steps once per K batches, so a
``clip_grad_norm_`` (or ``self.clip_gradients``) there clips the partial sum of the window
after each micro-batch, not the window's gradient once. ``configure_gradient_clipping``,
``on_before_optimizer_step`` and ``Trainer(gradient_clip_val=...)`` run once per optimizer
step and are right. A boundary test around the call is respected; a module that steps its
own optimizers (``automatic_optimization = False``) is not judged.

The Hugging Face Trainer calls ``TrainerCallback.on_substep_end`` after every micro-batch of
a window but its last (with ``gradient_accumulation_steps`` > 1): a clip there clips the
window's partial sum, K - 1 times per step. A clip whose ``max_norm`` is infinite only reads
the norm and is not reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
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


def _reads_only(call: ast.Call) -> bool:
    """``clip_grad_norm_(params, float("inf"))`` (or ``math.inf``): a norm read, no clip."""
    norm = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "max_norm"), None)
    if norm is None:
        return False
    text = ast.unparse(norm).replace(" ", "").lower()
    return text in ("float('inf')", 'float("inf")', "math.inf", "torch.inf", "np.inf", "numpy.inf")


@rule("AG138")
def clip_in_hf_substep_hook(ctx: FileContext) -> Iterator[Finding]:
    ga, how = ctx.trainer_ga()
    if ga == 1:
        return
    for func in ctx.of(*FUNCS):
        if func.name != "on_substep_end":
            continue
        for n in ctx.local_nodes(func):
            if not (isinstance(n, ast.Call) and call_attr(n) in CLIP_FUNCS) or _reads_only(n) \
                    or ctx.guarded(n, func):
                continue
            f = ctx.finding(
                "AG138",
                n,
                f"`{ast.unparse(n.func)}` in `on_substep_end`: the Hugging Face Trainer calls it "
                "after every micro-batch of a window but the last"
                + (f" ({how})" if ga is not None else "")
                + ", so the window's partial sum is clipped after each of its first K - 1 "
                "micro-batches instead of the window's gradient once",
                fix="clip once per optimizer step: TrainingArguments(max_grad_norm=...), or in "
                    "on_pre_optimizer_step; to only read the norm, pass max_norm=float('inf')",
            )
            yield f if ga is not None else replace(f, severity=Severity.WARNING,
                                                    confidence=Confidence.MEDIUM)
