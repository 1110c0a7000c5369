"""AG132 (LOSS_SCALE): an HF Trainer on an MoE model whose forward adds the router loss on
every micro-batch, with gradient accumulation.

transformers 5.24's MoE causal LMs (``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``,
``OlmoeForCausalLM``... the classes below, read in ``transformers/models/*/modeling_*.py``)
compute, when ``output_router_logits`` is on, ``loss = loss_function(..., **kwargs) +
router_aux_loss_coef * load_balancing_loss``. The stock ``Trainer`` passes
``num_items_in_batch`` to such a model (its forward takes ``**kwargs``), so the LM term is
normalised over the whole window and ``Trainer.training_step`` does *not* divide the loss
by K (``loss_is_scaled_for_ga``). The router term is a per-micro-batch mean that nobody
divides: over K micro-batches it weighs K times ``router_aux_loss_coef``. Proven by the
source when the model class, ``output_router_logits=True`` and a ``gradient_accumulation_steps``
> 1 are all in sight and the Trainer is stock (no ``compute_loss`` override, no
``compute_loss_func``, ``loss_is_scaled_for_ga`` unset): an error. A model loaded through an
``Auto*`` class with ``output_router_logits=True`` (an MoE model, class not in sight) is a
warning.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.epochtail import single_assignments

__all__ = ["hf_trainer_moe_router_loss_times_k", "model_class", "stock_trainers"]

#: causal LMs whose forward adds ``router_aux_loss_coef * aux_loss`` to the loss (5.24)
_MOE_CLASSES = re.compile(
    r"^(Dbrx|DeepseekV4|Doge|Ernie4_5_Moe|FlexOlmo|GptOss|GraniteMoe\w*|Jamba|MiniMax\w*|Mixtral"
    r"|Olmoe|Phimoe|Qwen2Moe|Qwen3Moe|Qwen3Next|Qwen3_5Moe)ForCausalLM$"
)


def model_class(ctx: FileContext, expr: ast.AST) -> str | None:
    """The class a model expression is built from (``MixtralForCausalLM(cfg)``,
    ``Qwen2MoeForCausalLM.from_config(cfg)``, a name assigned once from one)."""
    if isinstance(expr, ast.Name):
        values = single_assignments(ctx).get(expr.id, [])
        expr = values[0] if len(values) == 1 else expr
    if not isinstance(expr, ast.Call):
        return None
    name = dotted(expr.func) or ""
    parts = name.split(".")
    if parts[-1] in ("from_config", "from_pretrained", "_from_config") and len(parts) > 1:
        return parts[-2]
    return parts[-1]


def _router_logits_on(ctx: FileContext) -> bool | None:
    """``output_router_logits`` as the file sets it: True, False, or None (not set)."""
    values: set[object] = set()
    for call in ctx.of(ast.Call):
        for k in call.keywords:
            if k.arg == "output_router_logits":
                values.add(k.value.value if isinstance(k.value, ast.Constant) else None)
    for names, value in ctx.assignments():
        if any(n.endswith(".output_router_logits") for n in names):
            values.add(value.value if isinstance(value, ast.Constant) else None)
    if not values:
        return None
    return values == {True}


def stock_trainers(ctx: FileContext) -> Iterator[ast.Call]:
    """``Trainer(...)`` calls of the stock class or of a local subclass that leaves the loss
    alone (no ``compute_loss``, no ``loss_is_scaled_for_ga``)."""
    own: dict[str, bool] = {}
    for cls in ctx.of(ast.ClassDef):
        if any((dotted(b) or "").endswith("Trainer") for b in cls.bases):
            touches = any(
                isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in ("compute_loss", "training_step")
                or isinstance(n, ast.Name | ast.Attribute) and (dotted(n) or "").endswith("loss_is_scaled_for_ga")
                for n in walk_all(cls)
            )
            own[cls.name] = not touches
    for call in ctx.of(ast.Call):
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        if (name in ("Trainer", "Seq2SeqTrainer") or own.get(name, False)) and not any(
            k.arg in (None, "compute_loss_func") for k in call.keywords
        ):
            yield call


@rule("AG132")
def hf_trainer_moe_router_loss_times_k(ctx: FileContext) -> Iterator[Finding]:
    if not _router_logits_on(ctx):
        return
    ga, how = ctx.trainer_ga()
    if ga is not None and ga <= 1:
        return
    for call in stock_trainers(ctx):
        model = next((k.value for k in call.keywords if k.arg == "model"), call.args[0] if call.args else None)
        if model is None:
            continue
        cls = model_class(ctx, model)
        if cls is None:
            continue
        known = bool(_MOE_CLASSES.match(cls))
        if not known and not cls.startswith("Auto"):
            continue
        subject = (f"`{cls}`" if known else f"a model loaded through `{cls}` (its class is not in sight; "
                   "transformers' MoE causal LMs behave as follows)")
        msg = (f"the Trainer trains {subject} with `output_router_logits=True`: its forward adds "
               "`router_aux_loss_coef * aux_loss` (a per-micro-batch mean) to a loss the Trainer "
               "normalises over the window with num_items_in_batch and does not divide by K, so "
               "over the K micro-batches of a step the router term weighs K times its coefficient"
               + (f" ({how})" if ga is not None else ""))
        f = ctx.finding("AG132", call, msg)
        if not known or ga is None:
            f = replace(f, severity=Severity.WARNING, confidence=Confidence.LOW)
        yield f
