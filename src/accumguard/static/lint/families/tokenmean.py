"""AG129 (LOSS_SCALE): a hand-written window backwards each micro-batch's masked token mean
as is, and nothing divides by K.

``loss = -(adv * logp * mask).sum() / mask.sum(); loss.backward()`` in a window of K
micro-batches (the GRPO/PPO token loss, a hand-written LM loss) gives the optimizer the
sum of K per-micro-batch means: K times the large batch's mean gradient, with the tokens
of short micro-batches over-weighted on top (the mean of means, F5). The K x is what the
source proves, so this is an error in the LOSS_SCALE class, judged under the same
conditions as AG122 (a plain torch ``.backward()``, a window whose K is named like one,
no division by K anywhere in the file). The count may also be spelled apart from the mask:
a summed loss divided by a count of this micro-batch made on each micro-step
(``tok_sum / (labels != -100).sum()``, ``(logp * mask).sum() / lengths.sum()``). Divided by
K it is AG104's warning (F5).

AG104 (F5) under Lightning's automatic optimisation: ``accumulate_grad_batches=K > 1`` in
sight, and a ``LightningModule.training_step`` returns a mean over a variable number of
tokens (a masked mean, or a mean-reduced loss with ``ignore_index``/-100/a mask in the
method): Lightning divides what ``training_step`` returns by K, so the window's update is
the mean of K micro-batch means. A warning, as AG104's: exact for unpadded batches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, is_backward, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import (
    automatic_lightning_module,
    lightning_accumulates,
    returned_losses,
)
from accumguard.static.lint.families._masked import (
    count_expr,
    counted_mean,
    masked_mean,
    masks_labels,
    summed_loss,
    token_mean_hints,
)
from accumguard.static.lint.families.lgwindow import window_count_division
from accumguard.static.lint.families.scale import _k_in_sight, plain_windows

__all__ = ["lightning_token_mean", "masked_token_mean_never_divided_by_k"]


def _window_k(ctx: FileContext, window: ast.AST) -> str | None:
    """K bounding the window: ``range(K)``, a modulo by K, or ``while micro < K``."""
    k = _k_in_sight(ctx, window)
    if k is None and isinstance(window, ast.While):
        for sub in walk_all(window.test):
            if isinstance(sub, ast.Name | ast.Attribute) and ctx.mentions_accum(sub):
                return dotted(sub)
    return k


def _backwarded(call: ast.Call) -> ast.AST | None:
    """The loss of ``loss.backward()`` / ``scaler.scale(loss).backward()``, else None."""
    if call_attr(call) != "backward" or call.args or call.keywords:
        return None
    loss = receiver(call)
    if (isinstance(loss, ast.Call) and call_attr(loss) == "scale" and len(loss.args) == 1
            and "scaler" in (dotted(receiver(loss)) or "").lower()):
        loss = loss.args[0]
    return loss


@rule("AG129")
def masked_token_mean_never_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    for window in plain_windows(ctx):
        k = _window_k(ctx, window)
        if k is None:
            continue
        scope = ctx.window_scope(window)
        backwards = [n for n in ctx.local_nodes(window) if isinstance(n, ast.Call) and is_backward(n)]
        losses = [_backwarded(c) for c in backwards]
        if not backwards or any(x is None for x in losses):
            continue
        if not all(x is not None and (masked_mean(ctx, scope, x, set())
                                      or counted_mean(ctx, scope, window, x, set())) for x in losses):
            continue
        yield ctx.finding(
            "AG129",
            backwards[0],
            "each micro-batch's loss is a mean over its own tokens (a sum over its tokens divided "
            f"by its own token count) and is backwarded as is in a window of `{k}` micro-batches, and "
            f"nothing in the file divides by `{k}`: the window's gradient is the sum of K token "
            "means, K times the large batch's (and short micro-batches' tokens weigh more)",
        )


def _batch_counted_mean(ctx: FileContext, fn: ast.FunctionDef, expr: ast.AST) -> bool:
    """``nll.sum() / batch["mask"].sum()``: a sum divided by a count read from the step's own
    ``batch`` argument (one micro-batch per ``training_step`` call), directly or through the
    one value a name holds in the method."""
    if isinstance(expr, ast.Name):
        values = ctx.assigned_in(fn).get(expr.id, [])
        if len(values) != 1:
            return False
        expr = values[0]
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div)):
        return False
    params = {a.arg for a in fn.args.args[1:2]}  # (self, batch, batch_idx, ...)
    return summed_loss(expr.left) and count_expr(expr.right) and any(
        isinstance(n, ast.Name) and n.id in params for n in walk_all(expr.right))


_CE_CALLS = frozenset({"cross_entropy", "nll_loss"})


def _per_sample_ce(ctx: FileContext, fn: ast.FunctionDef, loss: ast.AST) -> bool:
    """``loss`` is (or is assigned once in ``fn`` from) a ``cross_entropy``/``nll_loss`` call
    over unflattened logits, with no ``ignore_index`` and no -100 anywhere in the file: one
    label per row (a sequence classifier beside its attention mask), a mean over the
    micro-batch's rows, not over a varying number of tokens."""
    if isinstance(loss, ast.Name):
        name = loss.id
        # (`loss = loss * K / tail`: a rescale of the same loss, not another one)
        writes = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
                  and not any(isinstance(x, ast.Name) and x.id == name for x in walk_all(n.value))]
        if len(writes) != 1:
            return False
        loss = writes[0].value
    if not (isinstance(loss, ast.Call) and call_attr(loss) in _CE_CALLS and loss.args):
        return False
    if any(k.arg == "ignore_index" for k in loss.keywords) or masks_labels(ctx):
        return False
    return not any(isinstance(n, ast.Call) and call_attr(n) in ("view", "reshape", "flatten")
                   for n in walk_all(loss.args[0]))


def _class_weighted_mean(fn: ast.FunctionDef, loss: ast.AST) -> bool:
    """``loss`` is (or is assigned once in ``fn`` from) a ``cross_entropy``/``nll_loss`` call
    with class weights (``weight=``) and its default 'mean': divided by this micro-batch's
    own sum of the class weights of its targets, which differs between micro-batches."""
    if isinstance(loss, ast.Name):
        writes = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and isinstance(n.targets[0], ast.Name) and n.targets[0].id == loss.id]
        if len(writes) != 1:
            return False
        loss = writes[0].value
    if not (isinstance(loss, ast.Call) and call_attr(loss) in _CE_CALLS):
        return False
    weighted = any(k.arg == "weight" and not (isinstance(k.value, ast.Constant) and k.value.value is None)
                   for k in loss.keywords) or len(loss.args) > 2
    reduction = next((k.value for k in loss.keywords if k.arg == "reduction"), None)
    return weighted and (reduction is None or (isinstance(reduction, ast.Constant)
                                               and reduction.value == "mean"))


@rule("AG104")
def lightning_token_mean(ctx: FileContext) -> Iterator[Finding]:
    if not lightning_accumulates(ctx):
        return
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or not automatic_lightning_module(ctx, fn):
            continue
        losses = returned_losses(fn)
        if not losses or any(window_count_division(ctx, fn, x) for x in losses):
            continue  # (a share of the window's count: AG144 judges its scale)
        weighted = all(_class_weighted_mean(fn, x) for x in losses)
        explicit = weighted or all(
            masked_mean(ctx, fn, x, set(), rows=False) or counted_mean(ctx, fn, fn, x, set())
            or _batch_counted_mean(ctx, fn, x) for x in losses)
        hints, summed = token_mean_hints(ctx, fn)
        if not explicit and (not hints or summed or all(_per_sample_ce(ctx, fn, x) for x in losses)):
            continue
        yield ctx.finding(
            "AG104",
            losses[0],
            "Lightning divides the loss `training_step` returns by accumulate_grad_batches, but it "
            "is a mean over "
            + ("this micro-batch's own sum of class weights (`weight=`: a weighted mean)"
               if weighted else "this micro-batch's own token count" if explicit else
               "a variable number of tokens (a padding or selection mask, or ignore_index, in sight)")
            + ": the window's update is the mean of K micro-batch means, which weights "
            + ("the samples of micro-batches with a small weight sum" if weighted else
               "short micro-batches' tokens")
            + " too much (mean of means)",
            fix="return the micro-batch's summed loss divided by the window's token count (count "
                "the tokens of the accumulate_grad_batches micro-batches once, all-reduced over "
                "the ranks) times accumulate_grad_batches, since Lightning divides by it",
        )
