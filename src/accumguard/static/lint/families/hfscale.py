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
from accumguard.static.lint._ast import dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["hf_compute_loss_divided_by_k_after_num_items"]

_NUM_ITEMS = "num_items_in_batch"


def _values(fn: ast.AST) -> dict[str, list[ast.AST]]:
    """The values ``fn`` assigns to each plain name (``x /= K`` counts as ``x / K``)."""
    out: dict[str, list[ast.AST]] = {}
    for n in walk_all(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, []).append(n.value)
    return out


def _window_normalised(expr: ast.AST, values: dict[str, list[ast.AST]], depth: int = 3) -> bool:
    """``expr`` is divided by ``num_items_in_batch``: a division by it, or the ``.loss`` of a
    call given it, inline or through a name assigned from one."""
    for sub in walk_all(expr):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Div) and any(
                isinstance(x, ast.Name) and x.id == _NUM_ITEMS for x in walk_all(sub.right)):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "loss":
            calls = [sub.value] if isinstance(sub.value, ast.Call) else (
                values.get(sub.value.id, []) if isinstance(sub.value, ast.Name) else [])
            if any(isinstance(c, ast.Call) and any(
                    k.arg == _NUM_ITEMS and isinstance(k.value, ast.Name) and k.value.id == _NUM_ITEMS
                    for k in c.keywords) for c in calls):
                return True
        if isinstance(sub, ast.Name) and depth > 0 and any(
                _window_normalised(v, values, depth - 1) for v in values.get(sub.id, [])):
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
    for cls in ctx.of(ast.ClassDef):
        if not any((last_part(dotted(b)) or "").endswith("trainer") for b in cls.bases):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name != "compute_loss":
                continue
            values = _values(fn)
            for node, dividend in _k_divisions(ctx, fn):
                if isinstance(dividend, ast.Name) and isinstance(node, ast.AugAssign):
                    normalised = any(_window_normalised(v, values) for v in values.get(dividend.id, []))
                else:
                    normalised = _window_normalised(dividend, values)
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
