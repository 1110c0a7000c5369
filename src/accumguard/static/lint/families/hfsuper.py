"""A ``Trainer.training_step`` override that does not hand ``num_items_in_batch`` on (F5):
AG304.

The Hugging Face Trainer calls ``training_step(model, inputs, num_items_in_batch)`` with the
window's token count. An override that calls ``super().training_step(model, inputs)`` (to
change the inputs, to log) passes None: the parent then lets the model average each
micro-batch over its own tokens and divides that mean by the accumulation steps, a mean of
per-micro-batch means where the large batch divides the window's summed loss by its
tokens. Silent when the count, or ``**kwargs``, is passed on.

AG334 (F7, a warning): a ``training_step`` override dividing the loss by
``self.args.gradient_accumulation_steps``. The Trainer runs an epoch's last window with the
micro-batches left (``self.current_gradient_accumulation_steps``, which its own
``training_step`` divides by); divided by the configured K, a short last window is scaled as
if it were full. A warning: whether an epoch has such a window depends on the data's size.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._hftrainer import trainer_methods

_COUNT = "num_items_in_batch"


def _super_call(node: ast.AST) -> bool:
    """``super().training_step(...)`` (or ``super(Cls, self)``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "training_step" and isinstance(node.func.value, ast.Call)
            and dotted(node.func.value.func) == "super")


@rule("AG304")
def training_step_drops_item_count(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "training_step"):
        if _COUNT not in {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}:
            continue
        for call in ast.walk(fn):
            if not _super_call(call):
                continue
            assert isinstance(call, ast.Call)
            passed = (len(call.args) >= 3 or any(k.arg in (_COUNT, None) for k in call.keywords)
                      or any(isinstance(a, ast.Starred) for a in call.args))
            if passed:
                continue
            yield ctx.finding(
                "AG304", call,
                f"`{ast.unparse(call)}` in `{cls.name}.training_step` drops the window's "
                f"`{_COUNT}`: the parent passes None to compute_loss, each micro-batch's loss "
                "is its own token mean, divided by the accumulation steps (a mean of "
                "per-micro-batch means)")


@rule("AG334")
def training_step_divides_by_configured_k(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "training_step"):
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                    and dotted(node.right) == "self.args.gradient_accumulation_steps":
                f = ctx.finding(
                    "AG334",
                    node,
                    f"`{cls.name}.training_step` divides the loss by "
                    "`self.args.gradient_accumulation_steps`, the configured K: an epoch whose "
                    "micro-batches are no multiple of K ends on a shorter window, which the "
                    "Trainer runs with `self.current_gradient_accumulation_steps` micro-batches; "
                    "divided by K, that window's update is scaled as if it were full")
                yield replace(f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                break
