"""``TrainingArguments.set_training`` resetting the accumulation steps (F1): AG314.

``args.set_training(learning_rate=..., batch_size=...)`` assigns every one of its parameters,
``gradient_accumulation_steps`` included, whose default is 1 (transformers 5): called on
arguments built with ``gradient_accumulation_steps=K`` and without that keyword, it puts K
back to 1, and the Trainer steps on every micro-batch. Reported when the receiver is a name
the file binds to a ``TrainingArguments`` (or a TRL config) built with K other than a
literal 1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["set_training_resets_k"]

_ARGS = ("TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig", "DPOConfig",
         "GRPOConfig", "RewardConfig")


def _built_with_k(ctx: FileContext, name: str) -> ast.AST | None:
    """The ``gradient_accumulation_steps`` value of the arguments ``name`` is bound to."""
    for value in ctx.values_by_name().get(name, []):
        if isinstance(value, ast.Call) and (dotted(value.func) or "").split(".")[-1] in _ARGS:
            for kw in value.keywords:
                if kw.arg == "gradient_accumulation_steps":
                    v = ctx.int_value(kw.value)
                    return kw.value if v is None or v > 1 else None
    return None


@rule("AG314")
def set_training_resets_k(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if not isinstance(call, ast.Call) or call_attr(call) != "set_training" \
                or not isinstance(call.func, ast.Attribute) \
                or any(k.arg == "gradient_accumulation_steps" or k.arg is None
                       for k in call.keywords):
            continue
        name = dotted(call.func.value)
        k = _built_with_k(ctx, name) if name else None
        if k is None:
            continue
        yield ctx.finding(
            "AG314", call,
            f"`{ast.unparse(call.func)}(...)` sets every training argument it takes, "
            f"`gradient_accumulation_steps` included (default 1), and is not given it: the "
            f"`gradient_accumulation_steps={ast.unparse(k)}` `{name}` was built with goes back "
            "to 1, so the Trainer steps after every micro-batch")
