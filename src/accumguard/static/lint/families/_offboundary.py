"""A call gated by a periodic test that is not the window's boundary.

``if step % eval_every == 0: evaluate(model, opt)`` beside ``if (step + 1) % K == 0:
opt.step()``: the test looks like a boundary (a counter modulo a constant) but its period is
another one, so what it runs (an evaluation that clears the gradients to free memory, a
checkpoint) lands inside windows. :func:`off_boundary_guard` reads the tests that gate a
call (through the helpers the window runs), and answers when every one of them is such a
periodic test on the window's own micro-batch counter, with a period N and a K both in
sight and N not a multiple of K: then some firings fall inside a window for sure.
"""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext

__all__ = ["off_boundary_guard"]


def _counters(expr: ast.AST) -> set[str]:
    return {last_part(d) for n in walk_all(expr) if (d := dotted(n)) is not None}


def _gating_tests(ctx: FileContext, node: ast.AST, window: ast.AST) -> list[ast.AST]:
    """The tests of the ``if``s between ``node`` and ``window``, through the call sites of the
    helpers the window runs."""
    links = {**ctx.reached(window), **ctx.inlined(window)}
    tests: list[ast.AST] = []
    child, cur = node, ctx.parents.get(node)
    seen: set[ast.AST] = set()
    while cur is not None and cur is not window:
        if isinstance(cur, ast.If) and child is not cur.test:
            tests.append(cur.test)
        if isinstance(cur, FUNCS):
            site = links.get(cur)
            if site is None or cur in seen:
                return tests
            seen.add(cur)
            child, cur = site, ctx.parents.get(site)
            continue
        child, cur = cur, ctx.parents.get(cur)
    return tests


def off_boundary_guard(ctx: FileContext, node: ast.AST, window: ast.AST) -> tuple[ast.AST, int, int] | None:
    """(the gating test, its period N, K) when ``node`` runs only under periodic tests of the
    window's micro-batch counter whose period N is not a multiple of K; else None."""
    boundary: list[tuple[set[str], int]] = []
    # (the window's own code and the helpers it runs on every micro-step: a trainer's
    # `train_step` holds the boundary test, the loop in `fit` is the window)
    scopes = [window, *ctx.inlined(window), *ctx.reached(window)]
    for n in (m for scope in dict.fromkeys(scopes) for m in walk_all(scope)):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and ctx.mentions_accum(n.right):
            k = ctx.int_through_names(n.right)
            if k is not None and k > 1:
                boundary.append((_counters(n.left), k))
    if isinstance(window, ast.For) and isinstance(window.iter, ast.Call) \
            and dotted(window.iter.func) == "range" and len(window.iter.args) == 1 \
            and ctx.mentions_accum(window.iter.args[0]):
        # nanoGPT's `for micro_step in range(K)`: the window is K micro-steps by
        # construction (another `% N` is a period, not K); a counter it adds 1 to on every
        # micro-step runs across windows
        k = ctx.int_through_names(window.iter.args[0])
        counted = {d for n in walk_all(window) if isinstance(n, ast.AugAssign)
                   and isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant)
                   and n.value.value == 1 and (d := dotted(n.target))}
        if k is not None and k > 1 and counted:
            boundary = [(c, b) for c, b in boundary if b == k] + [(counted, k)]
    ks = {k for _, k in boundary}
    if len(ks) != 1:
        return None
    k = next(iter(ks))
    counters = set().union(*(c for c, _ in boundary))
    tests = _gating_tests(ctx, node, window)
    # (a test naming K is a boundary test; the window's own micro-step counter is not K)
    # (a period whose value is no multiple of K is not K, whatever its name: `eval_every_micro`)
    periods = {id(x) for t in tests for m in walk_all(t)
               if isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod)
               and (v := ctx.int_through_names(m.right)) is not None and v % k
               for x in walk_all(m.right)}
    if not tests or any(ctx.mentions_accum(x) and not (_counters(x) & counters)
                        and id(x) not in periods for t in tests for x in walk_all(t)):
        return None
    for test in tests:
        for m in walk_all(test):
            if isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) and _counters(m.left) & counters:
                period = ctx.int_through_names(m.right)
                if period is not None and period % k:
                    return test, period, k
    return None
