"""AG144 (LOSS_SCALE): a ``LightningModule.training_step`` returns a summed loss divided by
the whole window's count, and Lightning divides it by K again.

Under automatic optimisation with ``accumulate_grad_batches=K > 1``, Lightning divides the
loss ``training_step`` returns by K before its backward. A loss that is already the
window's share (a token or sample sum divided by the count of the K micro-batches, as the
Hugging Face Trainer's ``num_items_in_batch``) then weighs 1/K of what the large batch gives
it: the update is G / K. Right is the same loss times ``accumulate_grad_batches``. The window count is known by its name (``win_tokens``,
``window_tokens``, ``num_items_in_batch``): a warning, not an error.

AG173 (LOSS_SCALE): ``training_step`` returns its loss divided by K itself (or through the one
return of a loss helper of the file it calls)
(``loss / self.trainer.accumulate_grad_batches``, or the value the Trainer's
``accumulate_grad_batches=`` is given), the habit of a hand-written loop: Lightning divides
the returned loss by K again, so each micro-batch weighs 1/K^2 and the update is G / K.

AG365 (LOSS_SCALE): a ``backward(self, loss)`` override adds a term (a regulariser kept out
of the logged loss) to the loss Lightning hands it, which Lightning has already divided by K:
the term weighs K times its share.

AG369 (LOSS_SCALE): an ``on_after_backward`` that adds a term to the parameters' ``.grad``
(an L2-SP gradient written by hand): it runs after every micro-batch, K times per update.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, label, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import (
    automatic_lightning_module,
    lightning_accumulates,
    returned_losses,
)

__all__ = ["lightning_backward_term_not_divided_by_k", "lightning_gradient_term_after_each_backward",
           "lightning_loss_divided_by_k",
           "lightning_window_count_divided_by_k", "window_count_division"]

#: a count of the whole window (every micro-batch of the step), by its name
_WINDOW_COUNT = re.compile(r"(^|_)(win|window)(_|$)|num_items_in_batch|items_in_window|"
                           r"window_(tokens|items|count|n)|(tokens|items)_per_(window|step)",
                           re.IGNORECASE)
_SUMMED = re.compile(r"sum|total", re.IGNORECASE)
_DEPTH = 4


def _expanded(fn: ast.AST, expr: ast.AST, depth: int = _DEPTH) -> list[ast.AST]:
    """``expr`` and the values its local names were assigned in ``fn``, ``depth`` deep."""
    out = [expr]
    if depth <= 0:
        return out
    names = {n.id for n in walk_all(expr) if isinstance(n, ast.Name)}
    if not names:
        return out
    for node in walk_all(fn):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id in names for t in targets):
            value = node.value
            assert value is not None
            out += _expanded(fn, value, depth - 1)
            if isinstance(node, ast.AugAssign):
                out.append(node)  # `loss /= win_tokens`, `loss *= K`
    return out


def _divisions(parts: list[ast.AST]) -> list[tuple[ast.AST, ast.AST]]:
    """(numerator, divisor) of every ``/`` and ``/=`` in the parts."""
    out: list[tuple[ast.AST, ast.AST]] = []
    for part in parts:
        for n in walk_all(part):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
                out.append((n.left, n.right))
            elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div):
                out.append((n.target, n.value))
    return out


def _summed(ctx: FileContext, fn: ast.AST, num: ast.AST) -> bool:
    """The numerator is a sum: ``.sum()``, ``reduction="sum"``, or a name saying so."""
    for part in _expanded(fn, num, 2):
        for n in walk_all(part):
            if isinstance(n, ast.Call) and (call_attr(n) == "sum" or any(
                    k.arg == "reduction" and isinstance(k.value, ast.Constant)
                    and k.value.value == "sum" for k in n.keywords)):
                return True
            if isinstance(n, ast.Name) and _SUMMED.search(n.id):
                return True
    return False


def _times_k(ctx: FileContext, parts: list[ast.AST]) -> bool:
    """Some part multiplies by K (or divides the count by it): a name that says so, or the
    one the Trainer's ``accumulate_grad_batches=`` is given (:meth:`mentions_accum`)."""
    for part in parts:
        for n in walk_all(part):
            if isinstance(n, ast.BinOp | ast.AugAssign) and isinstance(n.op, ast.Mult | ast.Div):
                sides = [n.value] if isinstance(n, ast.AugAssign) else [n.left, n.right]
                if any(ctx.mentions_accum(s) for s in sides):
                    return True
    return False


def window_count_division(ctx: FileContext, fn: ast.AST, loss: ast.AST
                          ) -> tuple[ast.AST, ast.AST] | None:
    """(numerator, divisor) where ``loss`` (as assigned in ``fn``) divides a sum by a count
    of the whole window, known by its name; None when it does not."""
    return next(((num, div) for num, div in _divisions(_expanded(fn, loss))
                 if _WINDOW_COUNT.search(label(div)) and _summed(ctx, fn, num)), None)


@rule("AG144")
def lightning_window_count_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    if not lightning_accumulates(ctx):
        return
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or not automatic_lightning_module(ctx, fn):
            continue
        for loss in returned_losses(fn):
            parts = _expanded(fn, loss)
            hit = window_count_division(ctx, fn, loss)
            if hit is None or _times_k(ctx, parts):
                continue
            yield ctx.finding(
                "AG144",
                loss,
                f"`training_step` returns a summed loss divided by `{label(hit[1])}`, a count "
                "of the whole window by its name, and Lightning divides the returned loss by "
                "accumulate_grad_batches (K) again: each micro-batch weighs 1/K of its "
                "large-batch share, so the update is G / K",
                fix="multiply the returned loss by `self.trainer.accumulate_grad_batches` "
                    "(Lightning divides by it; on several processes also by the number of "
                    "processes when the count is summed over all of them)",
            )
            break


def _divided_by_k(ctx: FileContext, fn: ast.AST, loss: ast.AST, depth: int = 1) -> ast.AST | None:
    """The divisor when ``loss`` (as assigned in ``fn``) is divided by K itself: Lightning's
    own ``accumulate_grad_batches`` attribute, or a name the file says is K, alone; also in
    the one return of a loss helper of the file it calls (``depth`` levels)."""
    parts = _expanded(fn, loss)
    for _, div in _divisions(parts):
        if isinstance(div, ast.Attribute) and div.attr == "accumulate_grad_batches":
            return div
        if isinstance(div, ast.Name | ast.Attribute) and ctx.mentions_accum(div):
            return div
    if depth > 0:
        # a loss helper of the file that returns its loss divided by K
        for part in parts:
            for call in (n for n in walk_all(part) if isinstance(n, ast.Call)):
                helper = ctx.callee_of(call)
                if helper is None:
                    continue
                rets = [n.value for n in walk_all(helper) if isinstance(n, ast.Return)
                        and n.value is not None]
                inner = _divided_by_k(ctx, helper, rets[0], depth - 1) if len(rets) == 1 else None
                if inner is not None:
                    return inner
    return None


@rule("AG173")
def lightning_loss_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "training_step" or not automatic_lightning_module(ctx, fn):
            continue
        for loss in returned_losses(fn):
            div = _divided_by_k(ctx, fn, loss)
            if div is None:
                continue
            own = isinstance(div, ast.Attribute) and div.attr == "accumulate_grad_batches"
            if not own and not lightning_accumulates(ctx):
                continue  # a K of the file's own, with the Trainer's out of sight
            parts = _expanded(fn, loss)
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                   and (ctx.mentions_accum(n.left) or ctx.mentions_accum(n.right)
                        or "accumulate_grad_batches" in ast.unparse(n))
                   for part in parts for n in walk_all(part)):
                continue  # multiplied by K somewhere too: not a plain second division
            yield ctx.finding(
                "AG173",
                loss,
                f"`training_step` returns its loss divided by `{ast.unparse(div)}` (K), and "
                "under automatic optimisation Lightning divides the returned loss by "
                "accumulate_grad_batches again: each micro-batch weighs 1/K^2, so the update "
                "is G / K",
                fix="return the loss undivided: Lightning scales it by 1/accumulate_grad_batches "
                    "itself",
            )
            break


def _over_k(ctx: FileContext, fn: ast.AST, term: ast.AST) -> bool:
    """``term`` (as its local names are assigned in ``fn``: ``reg = w * penalty / K`` ...
    ``loss + reg``) reads K: Lightning's ``accumulate_grad_batches`` or a name the file says
    is the accumulation count."""
    return any(ctx.mentions_accum(p) or "accumulate_grad_batches" in ast.unparse(p)
               for p in _expanded(fn, term))


def _added_terms(fn: ast.FunctionDef, loss: str) -> list[ast.AST]:
    """Terms ``fn`` adds to its ``loss`` parameter: ``loss + term`` (either side), ``loss +=
    term``; a term that itself reads ``loss`` is a rescaling of it, not a term."""
    def reads_loss(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == loss for n in walk_all(node))

    out: list[ast.AST] = []
    for n in walk_all(fn):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add | ast.Sub):
            for side, other in ((n.left, n.right), (n.right, n.left)):
                if isinstance(side, ast.Name) and side.id == loss and not reads_loss(other):
                    out.append(other)
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add | ast.Sub) \
                and isinstance(n.target, ast.Name) and n.target.id == loss \
                and not reads_loss(n.value):
            out.append(n.value)
    return out


@rule("AG365")
def lightning_backward_term_not_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    """AG365 (LOSS_SCALE): a ``LightningModule.backward(self, loss)`` override adds a term to
    the loss it is given. Under automatic optimisation with ``accumulate_grad_batches`` K > 1
    that loss is already divided by K (Lightning divides the closure's loss before it calls
    the hook); the term, added after, is not, and weighs K times its large-batch share."""
    if not lightning_accumulates(ctx):
        return
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "backward" or not automatic_lightning_module(ctx, fn):
            continue
        params = [a.arg for a in fn.args.args]
        if len(params) < 2 or not any(isinstance(n, ast.Call) and call_attr(n) in (
                "backward", "manual_backward") for n in walk_all(fn)):
            continue
        for term in _added_terms(fn, params[1]):
            if _over_k(ctx, fn, term):
                continue
            yield ctx.finding(
                "AG365",
                term,
                f"`backward` adds `{ast.unparse(term)}` to the loss Lightning hands it, which "
                "Lightning has already divided by accumulate_grad_batches (K); the term is not "
                "divided, so over a window it weighs K times its large-batch share",
                fix="divide the term by `self.trainer.accumulate_grad_batches`, or add it to "
                    "the loss `training_step` returns (Lightning divides that by K)",
            )
            return


def _grad_additions(fn: ast.FunctionDef) -> list[tuple[ast.AST, ast.AST]]:
    """(statement, added term) for each in-place addition to a ``.grad`` in ``fn``:
    ``p.grad.add_(t)``, ``p.grad += t``, ``p.grad = p.grad + t``."""
    out: list[tuple[ast.AST, ast.AST]] = []
    for n in walk_all(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_" \
                and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "grad" and n.args:
            out.append((n, ast.Tuple(elts=[*n.args, *(k.value for k in n.keywords)], ctx=ast.Load())))
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add | ast.Sub) \
                and isinstance(n.target, ast.Attribute) and n.target.attr == "grad":
            out.append((n, n.value))
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 \
                and isinstance(t := n.targets[0], ast.Attribute) and t.attr == "grad" \
                and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Add | ast.Sub) \
                and ast.dump(n.value.left) == ast.dump(t):
            out.append((n, n.value.right))
    return sorted(out, key=lambda a: (getattr(a[0], "lineno", 0), getattr(a[0], "col_offset", 0)))


@rule("AG369")
def lightning_gradient_term_after_each_backward(ctx: FileContext) -> Iterator[Finding]:
    """AG369 (LOSS_SCALE): a ``LightningModule.on_after_backward`` that adds a term to the
    parameters' ``.grad`` (an L2-SP or weight-decay gradient written by hand) while the
    Trainer accumulates K > 1: the hook runs after every micro-batch's backward, so the term
    is added K times per update where the large batch adds it once. Silent when the term is
    divided by K (``self.trainer.accumulate_grad_batches`` or the Trainer's value)."""
    if not lightning_accumulates(ctx):
        return
    for fn in ctx.of(ast.FunctionDef):
        if fn.name != "on_after_backward" or not automatic_lightning_module(ctx, fn):
            continue
        for stmt, term in _grad_additions(fn):
            if _over_k(ctx, fn, term):
                continue
            yield ctx.finding(
                "AG369",
                stmt,
                f"`{ast.unparse(stmt).splitlines()[0]}` adds a term to the gradient in "
                "`on_after_backward`, which Lightning calls after every micro-batch's backward: "
                "with accumulate_grad_batches = K the term is added K times per optimizer step, "
                "where the large batch adds it once",
                fix="add it once per update in `on_before_optimizer_step` (after the window's "
                    "last backward), or divide it by `self.trainer.accumulate_grad_batches`",
            )
            return
