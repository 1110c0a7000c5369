"""When a gradient clear inside an accumulation window erases nothing (AG102's exceptions).

AG102 reports a ``zero_grad()`` that runs on every micro-step of a window. Two placements
clear nothing the window accumulated, and are not reported:

* the clear opens each window: it runs only on the window's first micro-step (``if i == 0:``,
  ``if i % K == 0:``, or in a helper whose callers pass such a test or call it only under
  one), before anything of the window was accumulated;
* FSDP2 with the gradient sync deferred in the window (``set_requires_gradient_sync`` given
  something other than True, on every unit): while the sync is off FSDP2 keeps the gradient
  on its unsharded parameters, not in the sharded ``.grad`` that ``zero_grad()`` clears, so a
  clear before the micro-step's backward finds nothing to erase until the synced backward
  writes the window's reduced gradient (after it).
"""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, LOOPS, call_attr, dotted, is_backward, position
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument

__all__ = ["first_micro_step_only", "fsdp2_deferred_clear"]


def _window_index(window: ast.AST) -> str | None:
    """The name the window's loop counts its micro-steps with (``for i in range(K)``,
    ``for i, batch in enumerate(...)``)."""
    if not isinstance(window, ast.For | ast.AsyncFor):
        return None
    t = window.target
    if isinstance(t, ast.Tuple) and t.elts and isinstance(window.iter, ast.Call) \
            and dotted(window.iter.func) == "enumerate":
        t = t.elts[0]
    return t.id if isinstance(t, ast.Name) else None


def _is_first_test(ctx: FileContext, test: ast.AST, index: str | None) -> bool:
    """``i == 0`` / ``not i`` for the window's index ``i``, or ``x % K == 0`` / ``not x % K``
    for any counter: true on the window's first micro-step only."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = test.operand
        return (isinstance(inner, ast.Name) and inner.id == index) or (
            isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Mod)
            and ctx.mentions_accum(inner.right))
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0):
        return False
    left = test.left
    return (isinstance(left, ast.Name) and left.id == index) or (
        isinstance(left, ast.BinOp) and isinstance(left.op, ast.Mod) and ctx.mentions_accum(left.right))


def first_micro_step_only(ctx: FileContext, call: ast.AST, window: ast.AST, depth: int = 2) -> bool:
    """``call`` runs under an ``if`` true on the window's first micro-step only: the test
    itself, or a parameter of the helper holding it that every call in the window binds to
    such a test (``fb(x, first=(i == 0))``); or every call of its helper does (``if first:
    self._release_memory()``), ``depth`` helpers up."""
    index = _window_index(window)
    fn = ctx.enclosing(call, FUNCS)
    if _under_first_test(ctx, call, window, fn, index):
        return True
    if depth <= 0 or not isinstance(fn, FUNCS) or ctx.enclosing(window, FUNCS) is fn:
        return False
    sites = ctx.call_sites(fn)
    return bool(sites) and all(first_micro_step_only(ctx, site, window, depth - 1) for site in sites)


def _under_first_test(ctx: FileContext, call: ast.AST, window: ast.AST, fn: ast.AST | None,
                      index: str | None) -> bool:
    up: ast.AST | None = ctx.parents.get(call)
    while up is not None and up is not window and up is not fn:
        if isinstance(up, ast.If):
            if _is_first_test(ctx, up.test, index):
                return True
            if isinstance(up.test, ast.Name) and isinstance(fn, FUNCS):
                sites = ctx.call_sites(fn)
                bound = [bound_argument(fn, site, up.test.id) for site in sites]
                if sites and all(b is not None and _is_first_test(ctx, b, index) for b in bound):
                    return True
        up = ctx.parents.get(up)
    return False


def fsdp2_deferred_clear(ctx: FileContext, call: ast.Call, window: ast.AST) -> bool:
    """FSDP2 with the gradient sync deferred in the window (``set_requires_gradient_sync``
    given something other than True) and the clear made before the micro-step's backward:
    while the sync is off FSDP2 keeps the gradient on its unsharded parameters, not in the
    sharded ``.grad`` that ``zero_grad()`` clears, so the clear finds nothing to erase
    until the synced backward writes the window's reduced gradient (after it)."""
    shards = [c for c in ctx.of(ast.Call) if call_attr(c) == "fully_shard"]
    if not shards:
        return False
    nodes = [n for part in (window, *ctx.inlined(window), *ctx.reached(window))
             for n in ctx.local_nodes(part)]
    defer = [n for n in nodes if isinstance(n, ast.Call)
             and call_attr(n) == "set_requires_gradient_sync" and n.args
             and not (isinstance(n.args[0], ast.Constant) and n.args[0].value is True)
             and not _under_switch(ctx, n)]
    nested = len(shards) > 1 or any(ctx.enclosing(c, LOOPS) is not None for c in shards)
    if nested and any(any(k.arg == "recurse" and isinstance(k.value, ast.Constant)
                          and k.value.value is False for k in n.keywords) for n in defer):
        return False  # only the root unit defers: the nested units reduce into .grad each micro-step
    home = ctx.enclosing(call, FUNCS)
    backs = [n for n in nodes if isinstance(n, ast.Call) and is_backward(n)
             and ctx.enclosing(n, FUNCS) is home]
    if not defer or not backs or ctx.enclosing(call, LOOPS) is not ctx.enclosing(backs[0], LOOPS):
        return False
    return position(call) < min(position(b) for b in backs)


def _under_switch(ctx: FileContext, node: ast.AST) -> bool:
    """``node`` runs only when a setting says so: under an ``if`` (in its function) whose test
    is a bare name or attribute (``if self.cfg.defer_grad_sync:``), not a micro-step test."""
    home = ctx.enclosing(node, FUNCS)
    up = ctx.parents.get(node)
    while up is not None and up is not home:
        if isinstance(up, ast.If) and isinstance(up.test, (ast.Name, ast.Attribute)):
            return True
        up = ctx.parents.get(up)
    return False
