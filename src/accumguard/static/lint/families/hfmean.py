"""AG155 (LOSS_SCALE, and F5 for token losses): the stock Hugging Face ``Trainer`` with gradient accumulation over a model
class whose loss is a plain mean that ignores ``num_items_in_batch``.

transformers 5.x (``Trainer.__init__``) sets ``model_accepts_loss_kwargs`` when the model's
``forward`` takes ``**kwargs``; then ``compute_loss`` passes ``num_items_in_batch`` (the
window's label count) to the model and ``training_step`` counts the loss as already
normalised over the window: it does not divide it by K. Most causal LMs honour the count
(``self.loss_function(..., **kwargs)``), but many classes (``BertForMaskedLM``,
``RobertaForSequenceClassification``, ``T5ForConditionalGeneration``... the list in
``_hf_mean_loss``, generated from the installed library's source) take ``**kwargs`` and
compute ``CrossEntropyLoss()``'s mean over the micro-batch. Each micro-batch's mean then
reaches the gradient undivided: K times the large batch's gradient, and a mean of
per-micro-batch means when their label counts differ. Proven from the source when the class
is in sight (directly, through a function of the file that returns it, through
``get_peft_model``, or an ``AutoModelFor*`` built from a ``*Config`` of that family), the
Trainer is stock (no ``compute_loss`` or ``training_step`` override, no
``compute_loss_func``, no ``loss_is_scaled_for_ga``) and ``gradient_accumulation_steps`` > 1.
A ``nn.Module`` of the file is judged the same way: its ``forward`` takes ``**kwargs`` it never
reads, names no ``num_items_in_batch``, and computes a mean loss call (the stock Trainer then
counts its loss as normalised over the window). Not reported when the file sets ``accepts_loss_kwargs`` (``model.accepts_loss_kwargs =
False`` makes the Trainer divide by K) or when K is not in sight.

AG378 (F5, a warning): the other side of that switch. A token-level language model of the
file (a subclass of ``*ForCausalLM``, ``*ForConditionalGeneration``, ``*ForMaskedLM``) sets
``accepts_loss_kwargs = False`` (as some vision-language classes do) and the stock Trainer
trains it with K > 1: the Trainer then passes no ``num_items_in_batch``, the model returns
each micro-batch's own token mean and the Trainer divides it by K, a mean of K per-micro-batch
means. Right in scale; wrong whenever the micro-batches hold different numbers of
supervised tokens (padding, masked prompts), which the run shows and the source does not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._hf_mean_loss import MEAN_LOSS_CLASSES
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import MEAN_LOSS_FUNCS, mean_criteria, reduction
from accumguard.static.lint.families.epochtail import single_assignments
from accumguard.static.lint.families.moeaux import model_class, stock_trainers

__all__ = ["hf_trainer_model_mean_loss_not_divided", "token_lm_refuses_item_count"]

_WRAPPERS = frozenset({"get_peft_model", "prepare_model_for_kbit_training", "to"})


def _resolved_class(ctx: FileContext, expr: ast.AST, depth: int = 5) -> str | None:
    """The transformers class a model expression builds: a class call, a name assigned once
    from one, the one ``return`` of a function of the file, a PEFT wrapper's first argument,
    or ``AutoModelFor<Task>`` given a ``<Family>Config`` (``<Family>For<Task>``)."""
    if depth <= 0:
        return None
    if isinstance(expr, ast.Name):
        values = single_assignments(ctx).get(expr.id, [])
        return _resolved_class(ctx, values[0], depth - 1) if len(values) == 1 else None
    if not isinstance(expr, ast.Call):
        return None
    name = call_attr(expr) or ""
    if name in _WRAPPERS and isinstance(expr.func, ast.Name | ast.Attribute):
        inner = expr.args[0] if expr.args and name != "to" else (
            expr.func.value if isinstance(expr.func, ast.Attribute) else None)
        return _resolved_class(ctx, inner, depth - 1) if inner is not None else None
    fns = ctx.functions_by_name().get(name, [])
    if len(fns) == 1 and isinstance(expr.func, ast.Name):
        rets = [r.value for r in ast.walk(fns[0]) if isinstance(r, ast.Return) and r.value is not None]
        return _resolved_class(ctx, rets[0], depth - 1) \
            if len(rets) == 1 and isinstance(rets[0], ast.Call) else None
    cls = model_class(ctx, expr)
    if cls is not None and cls.startswith("AutoModelFor"):
        family = _config_family(ctx, expr)
        return None if family is None else family + cls[len("AutoModel"):]
    return cls


def _config_family(ctx: FileContext, call: ast.Call) -> str | None:
    """``Bert`` of ``AutoModelForMaskedLM.from_config(BertConfig(...))`` (the config given
    as the first argument or ``config=``, directly or through a name assigned once)."""
    cfg: ast.AST | None = call.args[0] if call.args else next(
        (k.value for k in call.keywords if k.arg == "config"), None)
    if isinstance(cfg, ast.Name):
        values = single_assignments(ctx).get(cfg.id, [])
        cfg = values[0] if len(values) == 1 else None
    if not isinstance(cfg, ast.Call):
        return None
    name = (dotted(cfg.func) or "").rsplit(".", 1)[-1]
    return name[: -len("Config")] if name.endswith("Config") and len(name) > len("Config") else None


def _file_mean_loss_classes(ctx: FileContext) -> set[str]:
    """Classes of the file whose ``forward`` takes ``**kwargs`` and never reads them nor a
    ``num_items_in_batch``, and computes a mean loss over its micro-batch (a mean loss call:
    ``F.cross_entropy(...)`` with the default reduction, or a mean loss module the class
    holds): the stock Trainer treats such a model as normalising by the window's count."""
    out: set[str] = set()
    criteria = mean_criteria(ctx)
    for cls in ctx.of(ast.ClassDef):
        fwd = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
        if fwd is None or fwd.args.kwarg is None:
            continue
        kw = fwd.args.kwarg.arg
        names = {n.id for n in ast.walk(fwd) if isinstance(n, ast.Name)}
        if kw in names or "num_items_in_batch" in names | {a.arg for a in fwd.args.args} or any(
                isinstance(n, ast.Attribute) and n.attr == "num_items_in_batch" for n in ast.walk(fwd)):
            continue
        if any(isinstance(c, ast.Call) and (
                ((call_attr(c) or "") in MEAN_LOSS_FUNCS and reduction(c) == "mean")
                or (dotted(c.func) or "") in criteria) for c in ast.walk(fwd)):
            out.add(cls.name)
    return out


def _sets_accepts_loss_kwargs(ctx: FileContext) -> bool:
    return any(n.endswith("accepts_loss_kwargs") for names, _ in ctx.assignments() for n in names)


@rule("AG155")
def hf_trainer_model_mean_loss_not_divided(ctx: FileContext) -> Iterator[Finding]:
    ga, how = ctx.trainer_ga()
    if ga is None or ga <= 1 or _sets_accepts_loss_kwargs(ctx):
        return
    for call in stock_trainers(ctx):
        model = next((k.value for k in call.keywords if k.arg == "model"), call.args[0] if call.args else None)
        cls = _resolved_class(ctx, model) if model is not None else None
        if cls is None or (cls not in MEAN_LOSS_CLASSES and cls not in _file_mean_loss_classes(ctx)):
            continue
        yield ctx.finding(
            "AG155",
            call,
            f"the Trainer trains `{cls}` with {how}: its forward takes **kwargs, so the Trainer "
            "passes num_items_in_batch and does not divide the loss by K, but this class's loss "
            "is a plain mean over the micro-batch that ignores num_items_in_batch: each "
            "micro-batch's mean reaches the gradient undivided: K times the large batch's "
            "gradient (and a mean of per-micro-batch means when their label counts differ)",
        )


_TOKEN_LM = ("ForCausalLM", "ForConditionalGeneration", "ForMaskedLM")


def _refusing_token_lms(ctx: FileContext) -> dict[str, ast.Assign]:
    """Classes of the file built on a token-level LM that set ``accepts_loss_kwargs = False``."""
    out: dict[str, ast.Assign] = {}
    for cls in ctx.of(ast.ClassDef):
        if not any((dotted(b) or "").endswith(_TOKEN_LM) for b in cls.bases):
            continue
        for st in cls.body:
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "accepts_loss_kwargs"
                                                  for t in st.targets) \
                    and isinstance(st.value, ast.Constant) and st.value.value is False:
                out[cls.name] = st
    return out


@rule("AG378")
def token_lm_refuses_item_count(ctx: FileContext) -> Iterator[Finding]:
    refusing = _refusing_token_lms(ctx)
    if not refusing:
        return
    ga, how = ctx.trainer_ga()
    if ga is None or ga <= 1:
        return
    for call in stock_trainers(ctx):
        model = next((k.value for k in call.keywords if k.arg == "model"), call.args[0] if call.args else None)
        cls = _resolved_class(ctx, model) if model is not None else None
        if cls not in refusing:
            continue
        yield ctx.finding(
            "AG378",
            refusing[cls],
            f"`{cls}` sets accepts_loss_kwargs = False and the Trainer (line {call.lineno}) trains "
            f"it with {how}: the Trainer passes it no num_items_in_batch, so its loss is each "
            "micro-batch's own token mean, which the Trainer divides by K: a mean of K "
            "per-micro-batch means, not the window's token mean, whenever the micro-batches hold "
            "different numbers of supervised tokens (padding, masked prompts)",
        )
        return
