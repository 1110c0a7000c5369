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
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, is_backward, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._masked import counted_mean, masked_mean
from accumguard.static.lint.families.scale import _k_in_sight, plain_windows

__all__ = ["masked_token_mean_never_divided_by_k"]


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
