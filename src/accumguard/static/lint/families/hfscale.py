"""AG136 (LOSS_SCALE): a Hugging Face ``Trainer`` subclass's ``compute_loss`` normalises the
loss by ``num_items_in_batch`` and divides it by the accumulation steps as well.

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
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, position, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["hf_compute_loss_divided_by_k_after_num_items"]

_NUM_ITEMS = "num_items_in_batch"


def _reaching(ctx: FileContext, fn: ast.AST, name: str, use: ast.AST) -> ast.AST | None:
    """The value of ``name`` at ``use``: its last plain assignment in ``fn`` before ``use``
    in a block around ``use`` (one in another branch does not reach it); None when the last
    write before it is anything else (an augmented or tuple assignment) or there is none."""
    around: set[ast.AST] = set()
    cur = ctx.parents.get(use)
    while cur is not None and cur is not fn:
        around.add(cur)
        cur = ctx.parents.get(cur)
    around.add(fn)
    writes = [n for n in ctx.local_nodes(fn) if isinstance(n, ast.Assign | ast.AugAssign)
              and n not in around and position(n) < position(use) and ctx.parents.get(n) in around
              and any(isinstance(t, ast.Name) and t.id == name
                      for t in walk_all(n.targets[0] if isinstance(n, ast.Assign) else n.target))]
    if not writes:
        return None
    last = max(writes, key=position)
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
