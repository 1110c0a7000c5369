"""AG136 (LOSS_SCALE): a Hugging Face ``Trainer`` subclass's ``compute_loss`` normalises the
loss by ``num_items_in_batch`` and divides it by the accumulation steps as well. AG143 (F10,
below): the same normalisation without the Trainer's ``* num_processes``.

``num_items_in_batch`` is the token count of the whole accumulation window (all K
micro-batches), so a loss divided by it (``loss_sum / num_items_in_batch``, or the model's
``.loss`` computed with ``num_items_in_batch=``) already carries the window's 1/N; divided by
``gradient_accumulation_steps`` too, the window's gradient is G / K. transformers 5.24
(``Trainer.training_step``) divides by K once more unless it counts the loss as scaled
(``loss_is_scaled_for_ga``, by default: the model takes ``**kwargs`` and
``num_items_in_batch`` was counted), so no setting makes the pair right: G / K when the
Trainer counts the loss as scaled, G / K² when the class sets ``loss_is_scaled_for_ga =
False``; and when ``num_items_in_batch`` is None (a model without ``**kwargs``, a batch
without ``labels``) the division by it raises, and the model given ``None`` returns its mean,
which the Trainer then divides by K after the method did (1/K²). Judged only when the
division by K and the normalisation by ``num_items_in_batch`` are both in the method, the
first applied to the second (inline, or through a name the method assigns).

AG118 (F5, at the end): a ``compute_loss`` override that returns a per-micro-batch mean and
never uses ``num_items_in_batch``; AG174 (LOSS_SCALE) beside it when the class sets
``loss_is_scaled_for_ga = True``: the Trainer then never divides by K, K x the large batch.

AG343 (LOSS_SCALE): the class sets ``loss_is_scaled_for_ga = False`` (to have the Trainer
divide an added per-micro-batch penalty by K) while ``compute_loss`` takes its main loss
already normalised by ``num_items_in_batch`` (``super().compute_loss(...,
num_items_in_batch=num_items_in_batch)``, the model given the count, or a division by it):
the Trainer divides that loss by K a second time. Silent when the model is a class of the
file whose ``forward`` takes no ``**kwargs`` (the Trainer then passes no count), when the
method divides by K itself, or when K is 1.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._lengths import returned_value
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import division, mean_loss_site

__all__ = ["hf_compute_loss_divided_by_k_after_num_items", "hf_compute_loss_num_items_not_times_w"]

_NUM_ITEMS = "num_items_in_batch"


def _reaching(ctx: FileContext, fn: ast.AST, name: str, use: ast.AST) -> ast.AST | None:
    """The value of ``name`` at ``use``: its last plain assignment in ``fn`` before ``use``
    in a block around ``use`` (one in another branch does not reach it); None when the last
    write before it is anything else (an augmented or tuple assignment) or there is none."""
    last = ctx.reaching_write(fn, name, use)
    if last is None:
        return None
    if isinstance(last, ast.Assign) and len(last.targets) == 1 and isinstance(last.targets[0], ast.Name):
        return last.value
    if (isinstance(last, ast.Assign) and len(last.targets) == 1
            and isinstance(last.targets[0], ast.Tuple) and last.targets[0].elts
            and isinstance(last.targets[0].elts[0], ast.Name) and last.targets[0].elts[0].id == name
            and isinstance(last.value, ast.Call) and call_attr(last.value) == "compute_loss"):
        return last.value  # `loss, outputs = super().compute_loss(..., return_outputs=True)`
    return None


def _window_normalised(ctx: FileContext, fn: ast.AST, expr: ast.AST, depth: int = 3) -> bool:
    """``expr`` is divided by ``num_items_in_batch``: a division by it, or the ``.loss`` of a
    call given it, inline or through the value a name holds there."""
    for sub in walk_all(expr):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div) and any(
                isinstance(x, ast.Name) and x.id == _NUM_ITEMS for x in walk_all(sub.right)):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "loss":
            call = sub.value if isinstance(sub.value, ast.Call) else (
                _reaching(ctx, fn, sub.value.id, sub) if isinstance(sub.value, ast.Name) else None)
            if isinstance(call, ast.Call) and any(
                    k.arg == _NUM_ITEMS and isinstance(k.value, ast.Name) and k.value.id == _NUM_ITEMS
                    for k in call.keywords):
                return True
        if isinstance(sub, ast.Call) and call_attr(sub) == "compute_loss" and any(
                k.arg == _NUM_ITEMS and isinstance(k.value, ast.Name) and k.value.id == _NUM_ITEMS
                for k in sub.keywords):
            return True  # the Trainer's own compute_loss given the window's count
        if isinstance(sub, ast.Name) and depth > 0:
            value = _reaching(ctx, fn, sub.id, sub)
            if value is not None and _window_normalised(ctx, fn, value, depth - 1):
                return True
    return False


def _k_divisions(ctx: FileContext, fn: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(division node, what it divides) for each division by the accumulation steps."""
    for n in walk_all(fn):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and ctx.mentions_accum(n.right):
            yield n, n.left
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) and ctx.mentions_accum(n.value):
            yield n, n.target


@rule("AG136")
def hf_compute_loss_divided_by_k_after_num_items(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in ctx.trainer_compute_losses():
        for node, dividend in _k_divisions(ctx, fn):
            if isinstance(node, ast.AugAssign) and isinstance(dividend, ast.Name):
                value = _reaching(ctx, fn, dividend.id, node)
                normalised = value is not None and _window_normalised(ctx, fn, value)
            else:
                normalised = _window_normalised(ctx, fn, dividend)
            if not normalised:
                continue
            yield ctx.finding(
                "AG136",
                node,
                f"`{cls.name}.compute_loss` divides by the accumulation steps "
                f"(`{ast.unparse(node)}`) a loss already normalised by `num_items_in_batch`, "
                "the token count of the whole window of K micro-batches: the window's "
                "gradient is G / K (G / K² if the Trainer divides by K too, "
                "`loss_is_scaled_for_ga = False`)",
            )


@rule("AG136")
def hf_training_step_divided_by_k_after_num_items(ctx: FileContext) -> Iterator[Finding]:
    """A Trainer subclass's ``training_step`` (the 4.x recipe kept after an upgrade) dividing
    by the accumulation steps the loss that ``compute_loss`` normalised by
    ``num_items_in_batch``: divided by K twice. Not under a test that reads
    ``num_items_in_batch`` (the Trainer's own ``if num_items_in_batch is None``)."""
    for cls in ctx.trainer_classes():
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name != "training_step":
                continue
            for node, dividend in _k_divisions(ctx, fn):
                if _under_num_items_test(ctx, node, fn):
                    continue
                if isinstance(node, ast.AugAssign) and isinstance(dividend, ast.Name):
                    value = _reaching(ctx, fn, dividend.id, node)
                    normalised = value is not None and _window_normalised(ctx, fn, value)
                else:
                    normalised = _window_normalised(ctx, fn, dividend)
                if not normalised and isinstance(dividend, ast.Name):
                    # (assigned inside `with self.compute_loss_context_manager():`, a block
                    # that always runs: the name's only other value)
                    values = [a.value for a in walk_all(fn) if isinstance(a, ast.Assign)
                              and any(isinstance(t, ast.Name) and t.id == dividend.id for t in a.targets)
                              and a is not ctx.parents.get(node)]
                    normalised = len(values) == 1 and _window_normalised(ctx, fn, values[0], 0)
                if normalised:
                    yield ctx.finding(
                        "AG136",
                        node,
                        f"`{cls.name}.training_step` divides by the accumulation steps "
                        f"(`{ast.unparse(node)}`) the loss `compute_loss` normalised by "
                        "`num_items_in_batch`, the token count of the whole window of K "
                        "micro-batches: the window's gradient is G / K (the Trainer's own "
                        "training_step divides only when num_items_in_batch is None)",
                    )


def _under_num_items_test(ctx: FileContext, node: ast.AST, fn: ast.AST) -> bool:
    cur = ctx.parents.get(node)
    while cur is not None and cur is not fn:
        if isinstance(cur, ast.If) and any(isinstance(x, ast.Name) and x.id == _NUM_ITEMS
                                           for x in walk_all(cur.test)):
            return True
        cur = ctx.parents.get(cur)
    return False


def _own_normalisation(fn: ast.AST) -> ast.AST | None:
    """The method's own division by ``num_items_in_batch`` (``loss / num_items_in_batch``), or
    the ``.loss`` of a model call given it: not the Trainer's ``compute_loss``, which
    multiplies by the number of processes itself. A name the method assigns from it
    (``denom = num_items_in_batch if num_items_in_batch is not None else n``) counts too."""
    counts = {_NUM_ITEMS} | {t.id for n in walk_all(fn) if isinstance(n, ast.Assign)
                             for t in n.targets if isinstance(t, ast.Name)
                             and any(isinstance(x, ast.Name) and x.id == _NUM_ITEMS
                                     for x in walk_all(n.value))}
    for sub in walk_all(fn):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div) and any(
                isinstance(x, ast.Name) and x.id in counts for x in walk_all(sub.right)):
            return sub
        if isinstance(sub, ast.AugAssign) and isinstance(sub.op, ast.Div) and any(
                isinstance(x, ast.Name) and x.id in counts for x in walk_all(sub.value)):
            return sub
        if isinstance(sub, ast.Call) and call_attr(sub) != "compute_loss" and any(
                k.arg == _NUM_ITEMS and isinstance(k.value, ast.Name) and k.value.id == _NUM_ITEMS
                for k in sub.keywords):
            return sub
    return None


def _times_world(ctx: FileContext, scope: ast.AST) -> bool:
    """A multiplication by the number of processes (or anything named after the world
    size) in ``scope``, or a quotient with it on top (``scale = num_processes / n_items``)."""
    for n in walk_all(scope):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (
                ctx.mentions_world(n.left) or ctx.mentions_world(n.right)):
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and ctx.mentions_world(n.left):
            return True
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Mult) and ctx.mentions_world(n.value):
            return True
    return False


def _per_rank_counts(ctx: FileContext) -> bool:
    """``average_tokens_across_devices=False`` in the file: ``num_items_in_batch`` is then
    this rank's count (AG140's case, not G / W)."""
    return any(k.arg == "average_tokens_across_devices"
               and not (isinstance(k.value, ast.Constant) and k.value.value is True)
               for call in ctx.of(ast.Call) for k in call.keywords)


_SEVERAL_RE = re.compile(r"world|num_processes|local_rank|process_index|is_main_process|get_rank")


def _several_processes(ctx: FileContext) -> bool:
    """The file reads the world size or a rank (``WORLD_SIZE``, ``is_world_process_zero()``,
    ``accelerator.num_processes``): it is written to run on several processes."""
    return any((isinstance(n, ast.Name) and _SEVERAL_RE.search(n.id.lower()))
               or (isinstance(n, ast.Attribute) and _SEVERAL_RE.search(n.attr.lower()))
               or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and _SEVERAL_RE.search(n.value.lower()))
               for n in ast.walk(ctx.tree))


@rule("AG143")
def hf_compute_loss_num_items_not_times_w(ctx: FileContext) -> Iterator[Finding]:
    """A warning: exact on one process, G / W on W (the launch is out of the file's sight),
    said only when the file reads the world size or a rank."""
    if _per_rank_counts(ctx) or not ctx.trainer_compute_losses() or not _several_processes(ctx):
        return
    for cls, fn in ctx.trainer_compute_losses():
        node = _own_normalisation(fn)
        if node is None or _times_world(ctx, cls) or any(
                isinstance(c, ast.Call) and call_attr(c) == "compute_loss"
                and (dotted(c.func) or "").startswith("super") for c in walk_all(fn)):
            continue
        yield ctx.finding(
            "AG143",
            node,
            f"`{cls.name}.compute_loss` normalises the loss by `num_items_in_batch` "
            f"(`{ast.unparse(node)}`), the window's token count summed over every process "
            "(average_tokens_across_devices, on by default), and never multiplies it by the "
            "number of processes as Trainer.compute_loss does: on W processes DDP averages the "
            "ranks again and the gradient is G / W (exact on one process)",
        )


def _uses_num_items(fn: ast.FunctionDef | ast.AsyncFunctionDef, ctx: FileContext | None = None) -> bool:
    """The body reads ``num_items_in_batch``, forwards ``**kwargs``, or calls the base class.
    Handed to a function of the file that never reads the parameter it binds
    (``token_loss(logits, labels, num_items_in_batch)`` with ``num_items`` unused there),
    the count is not used."""
    kwarg = fn.args.kwarg.arg if fn.args.kwarg else None
    for stmt in fn.body:
        for n in walk_all(stmt):
            if isinstance(n, ast.Name) and n.id == _NUM_ITEMS:
                if ctx is not None and _dropped_by_callee(ctx, n):
                    continue
                return True
            if isinstance(n, ast.Constant) and n.value == _NUM_ITEMS:
                return True  # kwargs.get("num_items_in_batch")
            if isinstance(n, ast.keyword) and n.arg is None and isinstance(n.value, ast.Name) and n.value.id == kwarg:
                return True  # **kwargs handed on
            if (
                isinstance(n, ast.Call) and call_attr(n) == "compute_loss"
                and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Call)
                and dotted(n.func.value.func) == "super"
            ):
                return True
    return False


def _dropped_by_callee(ctx: FileContext, name: ast.Name) -> bool:
    """``name`` is an argument of a call to a function of the file (defined once, no
    ``**kwargs``) whose parameter bound to it is never read in its body."""
    call = ctx.parents.get(name)
    if isinstance(call, ast.keyword):
        call = ctx.parents.get(call)
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return False
    fns = ctx.functions_by_name().get(call.func.id, [])
    if len(fns) != 1 or fns[0].args.kwarg is not None or fns[0].args.vararg is not None:
        return False
    fn = fns[0]
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
    param = next((p for p in params if bound_argument(fn, call, p) is name), None)
    if param is None:
        return False
    return not any(isinstance(x, ast.Name) and x.id == param and isinstance(x.ctx, ast.Load)
                   for stmt in fn.body for x in walk_all(stmt))


def _model_loss_without_count(ctx: FileContext, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                              node: ast.AST) -> bool:
    """``node`` is ``outputs.loss`` of a model call in ``fn`` given neither
    ``num_items_in_batch`` nor ``**kwargs`` (the model's own micro-batch mean), and nothing
    divides it by the window's count: ``num_items_in_batch`` read elsewhere in the method (an
    extra term's normaliser) does not normalise it."""
    if not (isinstance(node, ast.Attribute) and node.attr == "loss" and isinstance(node.value, ast.Name)):
        return False
    value = _reaching(ctx, fn, node.value.id, node)
    if not isinstance(value, ast.Call) or call_attr(value) == "compute_loss":
        return False
    if any(k.arg == _NUM_ITEMS or (k.arg is None and not (
            isinstance(k.value, ast.Name) and k.value.id == "inputs")) for k in value.keywords):
        return False  # (`**inputs` is the batch; another `**` may carry the count)
    return not _window_normalised(ctx, fn, node)


def _scaled_flag(cls: ast.ClassDef, ctx: FileContext | None = None, depth: int = 4) -> bool | None:
    """The class's ``loss_is_scaled_for_ga`` (transformers 5), when set to a constant; with
    ``ctx``, inherited from a base class of the file when the class does not set it (a team's
    token-loss base class with ``loss_is_scaled_for_ga = True``, subclassed for a mean loss)."""
    for n in walk_all(cls):
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any((dotted(t) or "").endswith("loss_is_scaled_for_ga") for t in targets):
                return n.value.value if isinstance(n.value, ast.Constant) and isinstance(n.value.value, bool) else None
    if ctx is None or depth <= 0:
        return None
    classes = {c.name: c for c in ctx.of(ast.ClassDef) if isinstance(c, ast.ClassDef)}
    for base in cls.bases:
        parent = classes.get(dotted(base) or "")
        if parent is not None and parent is not cls:
            got = _scaled_flag(parent, ctx, depth - 1)
            if got is not None:
                return got
    return None


def _given(test: ast.AST) -> bool | None:
    """What ``test`` says of ``num_items_in_batch``: True for ``is not None`` (or the bare
    name), False for ``is None`` (or ``not`` the name), None when it tests something else."""
    if dotted(test) == "num_items_in_batch":
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and dotted(test.operand) == "num_items_in_batch":
        return False
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and dotted(test.left) == "num_items_in_batch" \
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        return True if isinstance(test.ops[0], ast.IsNot) else False if isinstance(test.ops[0], ast.Is) else None
    return None


def _none_fallback(fn: ast.AST) -> ast.AST | None:
    """The count used when the Trainer passes ``num_items_in_batch=None``: ``<count>`` of
    ``num_items_in_batch if num_items_in_batch is not None else <count>``, or the divisor of
    the branch ``if num_items_in_batch is not None: loss = s / num_items_in_batch`` / ``else:
    loss = s / <count>`` runs for None (either test's form)."""
    for n in walk_all(fn):
        if isinstance(n, ast.IfExp) and (given := _given(n.test)) is not None:
            return n.orelse if given else n.body
        if isinstance(n, ast.If) and (given := _given(n.test)) is not None:
            branch = n.orelse if given else n.body
            divisors = [d.right for stmt in branch for d in ast.walk(stmt)
                        if isinstance(d, ast.BinOp) and isinstance(d.op, ast.Div)]
            if len(divisors) == 1:
                return divisors[0]
    return None


def _model_without_loss_kwargs(ctx: FileContext, cls: ast.ClassDef) -> ast.ClassDef | None:
    """The model class (of the file) every construction of the Trainer subclass ``cls`` is
    given, when its ``forward`` takes no ``**kwargs`` and nothing in the file sets
    ``accepts_loss_kwargs`` or ``model_accepts_loss_kwargs``: the Trainer then passes
    ``num_items_in_batch=None`` to ``compute_loss`` and divides the loss by K itself."""
    if any(isinstance(t, ast.Attribute | ast.Name) and (dotted(t) or "").rsplit(".", 1)[-1]
           in ("accepts_loss_kwargs", "model_accepts_loss_kwargs")
           for n in ctx.of(ast.Assign) for t in n.targets):
        return None
    classes: dict[str, ast.ClassDef] = {c.name: c for c in ctx.of(ast.ClassDef)}
    found: set[str] = set()
    for call in ctx.of(ast.Call):
        if not (isinstance(call.func, ast.Name) and call.func.id == cls.name):
            continue
        model = next((k.value for k in call.keywords if k.arg == "model"), call.args[0] if call.args else None)
        if isinstance(model, ast.Name):
            values = ctx.assigned_in(ctx.scope_of(model)).get(model.id, [])
            model = values[0] if len(values) == 1 else None
        if isinstance(model, ast.Call) and isinstance(model.func, ast.Name) \
                and model.func.id not in classes:
            model = returned_value(ctx, model)  # `model = build()`: what its one return builds
        if not (isinstance(model, ast.Call) and isinstance(model.func, ast.Name)):
            return None
        found.add(model.func.id)
    if len(found) != 1 or (model_cls := classes.get(next(iter(found)))) is None:
        return None
    forward = next((f for f in model_cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if forward is None or forward.args.kwarg is not None or any(
            isinstance(a, ast.Assign) and any((dotted(t) or "").endswith("accepts_loss_kwargs") for t in a.targets)
            for a in model_cls.body):
        return None
    return model_cls


@rule("AG118")
def hf_compute_loss_falls_back_to_micro_mean(ctx: FileContext) -> Iterator[Finding]:
    """A ``compute_loss`` normalised by ``num_items_in_batch`` with a per-micro-batch count as
    its fallback for None, while the model class's ``forward`` takes no ``**kwargs``: the
    Trainer passes None, so the fallback runs (and the Trainer divides by K)."""
    ga, how = ctx.trainer_ga()
    if ga == 1:
        return
    for cls, fn in ctx.trainer_compute_losses():
        fallback = _none_fallback(fn)
        if fallback is None:
            continue
        model_cls = _model_without_loss_kwargs(ctx, cls)
        if model_cls is None:
            continue
        yield replace(ctx.finding(
            "AG118",
            fallback,
            f"`{cls.name}.compute_loss` divides by `num_items_in_batch`, or by `{ast.unparse(fallback)}` "
            f"when it is None, and it is None here: `{model_cls.name}.forward` takes no **kwargs "
            "(and nothing sets `accepts_loss_kwargs`), so the Trainer does not count the window's "
            "items for compute_loss and divides the returned loss by K itself: each micro-batch's "
            "loss is a mean over its own count, and the window's update the mean of K such means "
            f"({how if ga else 'gradient accumulation on'}; exact only when every micro-batch holds "
            "as many items)",
            fix=f"set `accepts_loss_kwargs = True` on `{model_cls.name}` (the loss is normalised by "
                "num_items_in_batch already), or return the micro-batch's summed loss divided by the "
                "window's count and set `loss_is_scaled_for_ga = True` on the Trainer",
        ), severity=Severity.WARNING, confidence=Confidence.MEDIUM)


@rule("AG118", "AG174")
def hf_compute_loss_ignores_num_items(ctx: FileContext) -> Iterator[Finding]:
    """A ``Trainer`` subclass whose ``compute_loss`` returns a per-micro-batch mean and never
    uses ``num_items_in_batch``, with gradient accumulation on."""
    for cls, fn in ctx.trainer_compute_losses():
        site = mean_loss_site(ctx, fn, cls)
        if site is None:
            continue  # a summed loss, or one this rule cannot read
        elsewhere = _uses_num_items(fn, ctx)
        if elsewhere and not _model_loss_without_count(ctx, fn, site[0]):
            continue
        ga, how = ctx.trainer_ga()
        if ga == 1:
            continue  # no accumulation: a micro-batch is the batch
        node, what = site
        flag = _scaled_flag(cls, ctx)
        by_k = next((n for n in walk_all(fn)
                     if (d := division(n)) is not None and ctx.mentions_accum(d[1])), None)
        k_note = (
            f"; it divides by K itself (`{ast.unparse(by_k)}`): the right scale when transformers "
            "5 counts the loss as normalised (the model's forward takes **kwargs), 1/K too "
            "small when the Trainer divides again" if by_k is not None else
            "" if flag is not None else
            "; and since the class does not set `loss_is_scaled_for_ga = False`, transformers 5 "
            "counts the loss as already normalised whenever the model's forward takes **kwargs "
            "(most HF models) and the batch has `labels`, and skips its own division by K: the "
            "gradient is then K times too large as well"
        )
        plain_model = _model_without_loss_kwargs(ctx, cls)
        if plain_model is not None and by_k is None and flag is not True:
            # the model's forward takes no **kwargs: the Trainer counts nothing for it and
            # divides the returned mean by K itself (no K x scale; a mean of means only)
            k_note = (f"; `{plain_model.name}.forward` takes no **kwargs, so the Trainer "
                      "divides the returned mean by K itself")
        sure = not (ga is None or flag is not None or by_k is not None or plain_model is not None)
        # (flag True: the K x scale is certain and AG174's to say; the mean of means alone is
        # exact on equal micro-batches, a warning like the other uncertain cases)
        # (only the K x scale makes it sure; a mean of means is exact when every micro-batch of
        # a window holds as many tokens or samples: a classifier on full batches)
        effect = ("so the tokens of short micro-batches weigh more than in the large batch "
                  "(mean of means)" if sure else
                  "exact only when every micro-batch of a window holds as many tokens (or "
                  "samples); where they differ, those of short micro-batches weigh more than in "
                  "the large batch (mean of means)")
        finding = ctx.finding(
            "AG118",
            node,
            f"`{cls.name}.compute_loss` returns a per-micro-batch mean ({what}) and "
            + ("does not give the model `num_items_in_batch` (the method reads it only for "
               "other terms)" if elsewhere else "never uses `num_items_in_batch`")
            + f", with {how if ga else 'gradient accumulation possibly on (its value is not in sight)'}"
            f": the Trainer adds K micro-batch means, {effect}{k_note}; expected the window's "
            "summed loss divided by `num_items_in_batch`",
        )
        if not sure:
            finding = replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
        yield finding
        if flag is True and by_k is None and ga != 1:
            # the class says the loss is scaled for accumulation: the Trainer never divides
            yield ctx.finding(
                "AG174",
                node,
                f"`{cls.name}` " + ("sets" if _scaled_flag(cls) else "inherits")
                + " `loss_is_scaled_for_ga = True`, so the Trainer does not "
                f"divide the loss by K, but `compute_loss` returns a per-micro-batch mean "
                f"({what}), not the window's share: the window's gradient is the sum of K "
                "micro-batch means, K times the large batch's",
            )


def _window_share(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST | None:
    """Where ``fn`` takes a loss already normalised over the window's count: the base class's
    ``compute_loss`` or the model given ``num_items_in_batch=num_items_in_batch``, or a
    division by ``num_items_in_batch``."""
    for n in walk_all(fn):
        if isinstance(n, ast.Call) and any(
                k.arg == _NUM_ITEMS and dotted(k.value) == _NUM_ITEMS for k in n.keywords):
            return n
        if (d := division(n)) is not None and dotted(d[1]) == _NUM_ITEMS:
            return n
    return None


@rule("AG343")
def hf_scaled_flag_false_on_window_share(ctx: FileContext) -> Iterator[Finding]:
    """A ``Trainer`` subclass that sets ``loss_is_scaled_for_ga = False`` (so the Trainer
    divides ``compute_loss``'s result by K) while the method's loss is already the window's
    share (normalised by ``num_items_in_batch``): that part is divided by K twice."""
    for cls, fn in ctx.trainer_compute_losses():
        if _scaled_flag(cls) is not False:
            continue
        site = _window_share(fn)
        if site is None or ctx.trainer_ga()[0] == 1 or _model_without_loss_kwargs(ctx, cls) is not None:
            continue  # (a model without **kwargs gets no count: the Trainer's / K is then right)
        if any((d := division(n)) is not None and ctx.mentions_accum(d[1]) for n in walk_all(fn)):
            continue  # it undoes the Trainer's division itself
        yield ctx.finding(
            "AG343", site,
            f"`{cls.name}` sets `loss_is_scaled_for_ga = False`, so the Trainer divides "
            f"`compute_loss`'s result by K, but `{ast.unparse(site)}` is already normalised "
            "by `num_items_in_batch`, the window's count: that loss is divided by K twice "
            "(its gradient is 1/K of the large batch's)")
