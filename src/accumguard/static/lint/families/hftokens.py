"""AG140 (F6): ``TrainingArguments(average_tokens_across_devices=False)``.

The Hugging Face Trainer normalises a causal LM's loss by ``num_items_in_batch``, the token
count of the accumulation window. With ``average_tokens_across_devices=True`` (the default in
transformers 5) that count is summed over the ranks and the loss is scaled by the number of
processes, so that DDP's average is the whole batch's token mean. Set to False, each rank
divides by its own tokens and DDP averages the ranks' means: ranks with fewer tokens weigh
more (F6, a warning: exact only when every rank holds as many tokens, and irrelevant on one
process, which the file does not tell).

AG190 (F6): a ``Trainer`` subclass overriding ``get_batch_samples`` (to drop a key, to count
tokens its own way) returns a ``num_items_in_batch`` counted from this rank's batches only,
never gathered over the processes (``self.accelerator.gather(n).sum()``, an all-reduce).
With ``average_tokens_across_devices`` on, the Trainer still multiplies the loss by the number
of processes: each rank's loss is W times its own token mean, and DDP averages those, where
the large batch divides the summed loss by every rank's tokens. A warning, as AG140.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._hftrainer import trainer_methods

__all__ = ["batch_samples_count_not_gathered", "tokens_not_averaged_across_devices"]

_ARGS = ("TrainingArguments", "SFTConfig", "DPOConfig", "GRPOConfig", "ORPOConfig", "KTOConfig",
         "RewardConfig", "Seq2SeqTrainingArguments")


def _spread(ctx: FileContext, call: ast.Call) -> list[ast.keyword]:
    """The keywords of ``dict(...)`` calls assigned to a name the call spreads
    (``TrainingArguments(**train_kw)`` with ``train_kw = dict(..., k=v)``)."""
    names = {dotted(kw.value) for kw in call.keywords if kw.arg is None} - {None}
    if not names:
        return []
    dicts = ctx._cached("hf_dict_kw", ctx.tree, lambda: _dict_keywords(ctx))
    return [kw for name in names for kw in dicts.get(name, [])]


def _dict_keywords(ctx: FileContext) -> dict[str | None, list[ast.keyword]]:
    """Per name, the keywords of the ``dict(...)`` calls assigned to it (once per file)."""
    out: dict[str | None, list[ast.keyword]] = {}
    for node in ctx.of(ast.Assign):
        if (len(node.targets) == 1 and isinstance(node.value, ast.Call)
                and dotted(node.value.func) == "dict"):
            out.setdefault(dotted(node.targets[0]), []).extend(node.value.keywords)
    return out


def _false(ctx: FileContext, value: ast.AST) -> bool:
    """``False``, or a name the file assigns ``False`` once and nothing else
    (``AVG_TOKENS = False`` then ``average_tokens_across_devices=AVG_TOKENS``), or a switch
    off by default (``args.sync_tokens`` of a ``store_true`` option, a field ``= False``)."""
    if isinstance(value, ast.Name):
        values = ctx.values_by_name().get(value.id, [])
        value = values[0] if len(values) == 1 else value
    if isinstance(value, ast.Attribute):  # `args.sync_tokens`: a store_true option, a field
        return ctx.switch_default(value) is False
    return isinstance(value, ast.Constant) and value.value is False


@rule("AG140")
def tokens_not_averaged_across_devices(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] not in _ARGS:
            continue
        for kw in [*call.keywords, *_spread(ctx, call)]:
            if kw.arg == "average_tokens_across_devices" and _false(ctx, kw.value):
                yield ctx.finding(
                    "AG140", kw.value,
                    "average_tokens_across_devices=False: on several processes each rank "
                    "normalises its loss by its own token count and DDP averages the ranks' "
                    "means (rank-local normalisation: ranks with fewer tokens weigh more)")


_GATHERS = frozenset({"gather", "all_reduce", "reduce", "gather_for_metrics", "all_gather"})


@rule("AG190")
def batch_samples_count_not_gathered(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "get_batch_samples"):
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in _GATHERS for n in ast.walk(fn)):
            continue  # (gathered over the processes: the Trainer's own way)
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "get_batch_samples" for n in ast.walk(fn)):
            continue  # (super().get_batch_samples(...) counts and gathers)
        rets = [r for r in ast.walk(fn) if isinstance(r, ast.Return)
                and isinstance(r.value, ast.Tuple) and len(r.value.elts) == 2
                and not (isinstance(r.value.elts[1], ast.Constant) and r.value.elts[1].value is None)]
        if not rets:
            continue
        yield ctx.finding(
            "AG190",
            rets[0],
            f"`{cls.name}.get_batch_samples` returns a num_items_in_batch counted from this "
            "rank's batches only, never gathered over the processes: the Trainer still "
            "multiplies the loss by the number of processes (average_tokens_across_devices), so "
            "each rank's loss is W times its own token mean and DDP averages those, not the "
            "window's summed loss over every rank's tokens",
        )
