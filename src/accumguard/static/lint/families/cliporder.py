"""A clip gated to the accumulation boundary but run before that micro-step's backward (F8):
AG311.

``if boundary: clip_grad_norm_(...)`` placed above ``loss.backward()`` (or above
``engine.backward(loss)``, gated by ``engine.is_gradient_accumulation_boundary()``; Lightning's
``self.clip_gradients`` above ``self.manual_backward(loss)``), with
the optimizer's step below the backward: on the boundary micro-step the clip runs on the
gradient of the window's first K-1 micro-batches, and the last micro-batch's gradient is
added after it, unclipped, before the step. The large batch clips the whole window's
gradient once. Not reported: a clip after the window's last backward (the usual order), a
clip that runs on every micro-step (AG105), a step above the backward (a loop that steps the
previous window at the top of the next micro-step clips a whole window).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, is_backward
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["clip_before_the_boundary_backward"]

#: clipping calls that act on gradients (unscale_ is AG135's)
_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_gradients",
                    "clip_grads_with_norm_"})


def _site(ctx: FileContext, node: ast.AST, window: ast.AST,
          fns: set[ast.AST]) -> ast.AST | None:
    """``node``, or the call of the window's helpers that leads to it, in one of ``fns``."""
    links = {**ctx.reached(window), **ctx.inlined(window)}
    seen: set[ast.AST] = set()
    cur: ast.AST = node
    while True:
        fn = ctx.enclosing(cur, FUNCS) or ctx.tree
        if fn in fns or (fn is ctx.tree and ctx.tree in fns):
            return cur
        if fn not in links or fn in seen:
            return None
        seen.add(fn)
        cur = links[fn]


def _statement(ctx: FileContext, node: ast.AST, block: list[ast.stmt]) -> int | None:
    """The index in ``block`` of the statement holding ``node`` (a position map of the block,
    built once per block: a module's body is long)."""
    where = _positions(ctx, block)
    cur: ast.AST | None = node
    while cur is not None:
        i = where.get(id(cur))
        if i is not None and block[i] is cur:
            return i
        cur = ctx.parents.get(cur)
    return None


def _positions(ctx: FileContext, block: list[ast.stmt]) -> dict[int, int]:
    """``id(statement) -> index`` in ``block``, once per block."""
    def compute() -> dict[int, int]:
        return {id(st): i for i, st in enumerate(block)}
    return ctx._cached("cliporder_index", block[0], compute) if block else {}


def _blocks(ctx: FileContext, node: ast.AST, root: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists of ``root`` that hold ``node`` (the only blocks where its
    statement has an index), outermost first, as a walk from ``root`` meets them."""
    out: list[list[ast.stmt]] = []
    cur: ast.AST | None = node
    while cur is not None and cur is not root:
        par = ctx.parents.get(cur)
        if par is None:
            break
        for name in ("body", "orelse", "finalbody"):
            block = getattr(par, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt) \
                    and _positions(ctx, block).get(id(cur)) is not None:
                out.append(block)
        cur = par
    return out[::-1]


@rule("AG311")
def clip_before_the_boundary_backward(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if facts.summed_loss or facts.unguarded_optimizer_steps \
                or not (facts.accumulating or facts.engine_backward):
            continue
        backwards = [n for part in (window, *ctx.inlined(window)) for n in ctx.local_nodes(part)
                     if isinstance(n, ast.Call) and is_backward(n)]
        steps = [c for c, kind in facts.steps if kind in ("optimizer", "engine")]
        if not backwards or not steps:
            continue
        fns = {ctx.enclosing(b, FUNCS) or ctx.tree for b in backwards}
        for clip in facts.clips:
            if call_attr(clip) not in _CLIPS or not ctx.guarded(clip, window):
                continue
            site = _site(ctx, clip, window, fns)
            if site is None:
                continue
            fn = ctx.enclosing(site, FUNCS) or ctx.tree
            for block in _blocks(ctx, site, fn):
                at = _statement(ctx, site, block)
                if at is None:
                    continue
                bws = [i for b in backwards if (i := _statement(ctx, b, block)) is not None]
                sts = [i for s in steps
                       if (ctx.enclosing(s, FUNCS) or ctx.tree) is fn
                       and (i := _statement(ctx, s, block)) is not None]
                if not bws or not sts or min(bws) <= at or max(sts) <= min(bws):
                    continue
                bw = backwards[0]
                yield ctx.finding(
                    "AG311", clip,
                    f"`{call_attr(clip)}`{ctx.via_text(clip, window)} runs at the accumulation "
                    f"boundary but before that micro-step's backward (line {bw.lineno}), and the "
                    "step comes after it: the clip acts on the window's first K-1 micro-batches "
                    "only, and the last micro-batch's gradient is added unclipped before the "
                    "step; clip after the window's last backward, right before the step")
                return
