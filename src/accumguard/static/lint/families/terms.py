"""Loss terms (LOSS_SCALE): one term of a summed loss divided by K, another not.

AG127: in a hand-written accumulation window the backwarded loss is a sum of terms, one of
them divided by K (the accumulation count: ``ce / accumulation_steps``) and another added
after that division or beside it undivided (``loss = ce / K + aux_coef * aux``, or
``loss = ce / K`` then ``loss = loss + aux_coef * aux`` / ``loss += z_loss``). Over the K
micro-batches of a window the divided term adds up to its large-batch mean, the other to K
times its mean: the auxiliary (router, load-balancing, z-loss, regulariser) term weighs K
times its coefficient relative to the main term. The terms are read from the
assignments to the backwarded name in the window, in order (one level: ``loss = loss + x``,
``loss += x``, ``loss = loss / K``, ``loss /= K``). Not judged: Accelerate, DeepSpeed and
Lightning backwards (they divide the whole loss themselves), a term that is a constant, a
window whose loss cannot be followed (a name assigned in a branch, a helper), a term with
any division of its own (``ce_sum / window_tokens``: normalised by the window's count).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, is_backward, position, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule


@dataclass
class _Term:
    expr: ast.AST
    divided: bool  # divided by K


def _divides_by_k(ctx: FileContext, node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.FloorDiv)
            and ctx.mentions_accum(node.right))


def _has_k_division(ctx: FileContext, expr: ast.AST) -> bool:
    return any(_divides_by_k(ctx, n) for n in walk_all(expr))


def _split(ctx: FileContext, expr: ast.AST, name: str, prev: list[_Term] | None) -> list[_Term] | None:
    """The additive terms of ``expr``; ``name`` (the loss itself, ``loss = loss + x``) stands
    for ``prev``. None when it cannot be followed (``name`` unknown, a subtraction of it)."""
    if dotted(expr) == name:
        return None if prev is None else [_Term(t.expr, t.divided) for t in prev]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left = _split(ctx, expr.left, name, prev)
        right = _split(ctx, expr.right, name, prev)
        return None if left is None or right is None else left + right
    if _divides_by_k(ctx, expr) and isinstance(expr, ast.BinOp):
        inner = _split(ctx, expr.left, name, prev)
        return None if inner is None else [_Term(t.expr, True) for t in inner]
    if any(dotted(n) == name for n in walk_all(expr)):
        return None  # the loss inside a product or a call: not a plain sum
    return [_Term(expr, _has_k_division(ctx, expr))]


def _terms_at(ctx: FileContext, window: ast.AST, name: str, backward: ast.Call) -> list[_Term] | None:
    """The terms of ``name`` when ``backward`` runs, from the window's assignments before it
    (all in the window's own block: one inside an ``if`` makes the sum undecidable)."""
    terms: list[_Term] | None = None
    writes = [n for n in ctx.local_nodes(window)
              if isinstance(n, ast.Assign | ast.AugAssign) and position(n) < position(backward)
              and any(dotted(t) == name for t in _targets(n))]
    for w in sorted(writes, key=position):
        if ctx.enclosing(w, (ast.If, ast.Try, ast.Match, *_LOOPS)) is not ctx.enclosing(
                backward, (ast.If, ast.Try, ast.Match, *_LOOPS)):
            return None
        if isinstance(w, ast.Assign):
            if len(w.targets) != 1:
                return None
            if dotted(w.targets[0]) != name:  # `logits, loss, aux = model(x)`: one fresh term
                terms = [_Term(ast.Name(name), False)]
                continue
            terms = _split(ctx, w.value, name, terms)
        elif terms is None:
            return None
        elif isinstance(w.op, ast.Add):
            extra = _split(ctx, w.value, name, None)
            terms = None if extra is None else terms + extra
        elif isinstance(w.op, ast.Div) and ctx.mentions_accum(w.value):
            terms = [_Term(t.expr, True) for t in terms]
        else:
            return None
        if terms is None:
            return None
    return terms


_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _targets(node: ast.Assign | ast.AugAssign) -> list[ast.AST]:
    """The names an assignment writes, tuple targets unpacked one level."""
    out: list[ast.AST] = []
    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
        out += list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
    return out


def _constant(expr: ast.AST) -> bool:
    """A constant, or ``0 * x`` (DDP's unused-parameter trick adds no gradient)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult) and any(
            isinstance(side, ast.Constant) and side.value == 0 for side in (expr.left, expr.right)):
        return True
    return all(isinstance(n, ast.Constant | ast.operator | ast.unaryop | ast.BinOp | ast.UnaryOp)
               for n in walk_all(expr))


def _divided_by_anything(expr: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv) for n in walk_all(expr))


@rule("AG127")
def loss_term_not_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if (not facts.accumulating or facts.summed_loss or facts.unguarded_optimizer_steps
                or facts.accelerate or facts.engine_backward):
            continue
        for bw in (n for n in ctx.local_nodes(window) if isinstance(n, ast.Call) and is_backward(n)):
            if call_attr(bw) != "backward" or bw.args:
                continue
            loss = receiver(bw)
            if isinstance(loss, ast.Call) and call_attr(loss) == "scale" and len(loss.args) == 1:
                loss = loss.args[0]  # scaler.scale(loss).backward()
            if loss is None:
                continue
            name = dotted(loss)
            terms = _terms_at(ctx, window, name, bw) if name is not None else _split(ctx, loss, "", None)
            if not terms or len(terms) < 2:
                continue
            divided = [t for t in terms if t.divided]
            if not divided:
                continue
            for t in terms:
                if t.divided or _constant(t.expr) or _divided_by_anything(t.expr):
                    continue  # a term over the window's token count (`ce_sum / n_window`) is right
                main = ast.unparse(divided[0].expr)
                yield ctx.finding(
                    "AG127",
                    t.expr,
                    f"the loss term `{ast.unparse(t.expr)}` is not divided by K while `{main}` is: "
                    "summed over the window's K micro-batches it weighs K times its coefficient "
                    "relative to the large batch's loss",
                )
