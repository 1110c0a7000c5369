"""AG141 (F7): the final partial window is stepped, but its loss is still divided by K.

``if (i + 1) % K == 0 or i + 1 == len(loader): step`` (or a step after the loop:
``if micro % K != 0: optimizer.step()``) flushes the last ``len % K``
micro-batches of a pass instead of leaking them (AG117's case), but when every micro-batch's
loss is divided by the constant K, that short window of r < K micro-batches reaches the
optimizer as r/K of its mean gradient: its update is shrunk by r/K while the full windows'
are not. Right: divide the tail's losses by its own size (``min(K, len - start)``), or by the
window's sample/token count. An error when the pass length and K are in sight and leave a
tail; a warning when the length is not in sight (no tail when it divides by K).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, is_backward, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._ctx_ownrate import stepped_name
from accumguard.static.lint._lengths import static_len
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lossexpr import divides_by_k, division, flows_to_backward
from accumguard.static.lint.families._modguard import (
    ModGuard,
    assignments_by_name,
    call_test,
    k_values,
    mod_term,
)
from accumguard.static.lint.families._windowtail import hand_for_windows, pure_mod_guard

__all__ = ["strided_tail_divided_by_k", "tail_gradient_divided_by_window_size", "tail_window_divided_by_k"]


def _len_name(ctx: FileContext, node: ast.AST, scope: ast.AST) -> bool:
    """``len(...)``, or a name the scope assigns once from ``len(...)`` (``n = len(loader)``)."""
    for sub in walk_all(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "len":
            return True
        if isinstance(sub, ast.Name):
            writes = assignments_by_name(ctx, scope).get(sub.id, [])
            if len(writes) == 1 and isinstance(writes[0], ast.Assign) and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "len"
                    for c in walk_all(writes[0].value)):
                return True
    return False


def _flush_guard(ctx: FileContext, call: ast.AST,
                 window: ast.AST) -> tuple[ast.AST, ModGuard, ast.AST] | None:
    """The ``if`` around ``call`` whose test is ``<modulo window test> or <end of the pass>``
    (``i + 1 == len(loader)``, ``i == n - 1`` with ``n = len(loader)``): (where it is read,
    its modulo, the test). In a helper the window runs, an ``if`` on one of its parameters
    reads the argument the window's call gives it (``loss_scaler(..., update_grad=flag)``)."""
    scope = ctx.scope_of(window)
    tested: list[str] = []
    seen: set[ast.AST] = set()
    child, cur = call, ctx.parents.get(call)
    while cur is not None and cur is not window:
        if isinstance(cur, ast.If) and child in cur.body:
            test = _flag_value(ctx, cur.test, window)
            guard = _flush_test(ctx, test, scope)
            if guard is not None:
                return cur, guard, test
            if isinstance(cur.test, ast.Name):
                tested.append(cur.test.id)
        skip = _skipped_unless(ctx, cur, child, window, scope)
        if skip is not None:
            return skip
        if isinstance(cur, FUNCS) and tested and (site := ctx.inlined(window).get(cur)) is not None:
            for name in tested:
                arg = bound_argument(cur, site, name)
                if arg is None:
                    continue
                value = _flag_value(ctx, arg, window)
                guard = _flush_test(ctx, value, scope)
                if guard is not None:
                    return site, guard, value
        if isinstance(cur, FUNCS) and cur not in seen and (
                up := {**ctx.reached(window), **ctx.inlined(window)}.get(cur)) is not None:
            # a helper the window runs (`self._optimizer_step()`): go on from its call
            seen.add(cur)
            child, cur = up, ctx.parents.get(up)
            continue
        child, cur = cur, ctx.parents.get(cur)
    if cur is window:
        return _skipped_unless(ctx, window, child, window, scope)
    return None


def _skipped_unless(ctx: FileContext, block_owner: ast.AST, child: ast.AST, window: ast.AST,
                    scope: ast.AST) -> tuple[ast.AST, ModGuard, ast.AST] | None:
    """``if not <flag>: continue`` before ``child`` in its block, the flag a flush test
    (nanoGPT's ``if not last_in_window: continue`` then the step)."""
    for field in ("body", "orelse"):
        block = getattr(block_owner, field, None)
        if not isinstance(block, list) or child not in block:
            continue
        for stmt in block[:block.index(child)]:
            if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.UnaryOp) \
                    and isinstance(stmt.test.op, ast.Not) and stmt.body \
                    and isinstance(stmt.body[-1], ast.Continue) and not stmt.orelse:
                value = _flag_value(ctx, stmt.test.operand, window)
                guard = _flush_test(ctx, value, scope)
                if guard is not None:
                    return stmt, guard, value
    return None


def _flush_test(ctx: FileContext, test: ast.AST, scope: ast.AST) -> ModGuard | None:
    """The modulo of ``<modulo window test> or <end of the pass>``, else None."""
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)):
        return None
    mods = [(t, g) for t in test.values if (g := mod_term(t)) is not None]
    others = [_end_value(ctx, t, scope) for t in test.values if all(t is not m for m, _ in mods)]
    if len(mods) == 1 and others and all(
            isinstance(t, ast.Compare) and any(isinstance(op, ast.Eq | ast.GtE) for op in t.ops)
            and _len_name(ctx, t, scope) for t in others):
        return mods[0][1]
    return None


def _end_value(ctx: FileContext, term: ast.AST, scope: ast.AST) -> ast.AST:
    """``term``, or the comparison a name in it is bound to once in the scope (timm's
    ``last_batch = batch_idx == last_batch_idx`` then ``need_update = last_batch or ...``)."""
    if not isinstance(term, ast.Name):
        return term
    writes = assignments_by_name(ctx, scope).get(term.id, [])
    if len(writes) == 1 and isinstance(writes[0], ast.Assign) \
            and isinstance(writes[0].value, ast.Compare):
        return writes[0].value
    return term


def _flag_value(ctx: FileContext, test: ast.AST, window: ast.AST) -> ast.AST:
    """``test``, or the value of the one assignment in the window to the name it is
    (``update_now = (i + 1) % K == 0 or i + 1 == len(loader)`` then ``if update_now:``)."""
    if not isinstance(test, ast.Name):
        return call_test(ctx, test) or test
    writes = [n for n in ctx.local_nodes(window) if isinstance(n, ast.Assign)
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
              and n.targets[0].id == test.id]
    if len(writes) != 1:
        return test
    # (`boundary = self.is_boundary(i, n)`: the predicate's test with the arguments in place)
    return call_test(ctx, writes[0].value) or writes[0].value


def _steps_after(ctx: FileContext, window: ast.AST, step: ast.Call) -> bool:
    """A statement after the window loop, in the block that holds it, steps the window's
    optimizer, before any later backward: the partial window left when the loop ends is
    flushed there (a reference loop after the training, with its own backward and its own
    optimizer, flushes nothing)."""
    parent = ctx.parents.get(window)
    stepped = stepped_name(step)
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and window in block:
            for stmt in block[block.index(window) + 1:]:
                nodes = list(walk_all(stmt))
                if any(isinstance(n, ast.Call) and is_backward(n) for n in nodes):
                    return False  # the next loop of training (or a reference): no flush before it
                for n in nodes:
                    if (ctx.is_step(n) or (ctx.is_step(n, ("scaler",)) and n.args)) \
                            and (stepped is None or stepped_name(n) == stepped):
                        return True
    return False


def _tail_sized(node: ast.AST) -> bool:
    """The divisor is the window's own size: ``min(K, len(loader) - start)`` or any
    ``min(...)`` with a length or a remainder in it (the tail divided by its r micro-batches)."""
    d = division(node)
    if d is None:
        return False
    return any(isinstance(c, ast.Call) and call_attr(c) == "min" and any(
        (isinstance(x, ast.Call) and call_attr(x) == "len")
        or (isinstance(x, ast.BinOp) and isinstance(x.op, ast.Mod | ast.Sub))
        for a in c.args for x in walk_all(a)) for c in walk_all(d[1]))


def _scale_handed_to_helper(ctx: FileContext, window: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """``accumulate(batch, 1.0 / K)`` in the window, ``accumulate`` a backward helper of the file
    (called there) that multiplies its loss by that parameter (``loss = f(...) * scale``): the
    division by K, handed in as the loss's scale."""
    out: list[tuple[ast.AST, ast.AST]] = []
    for helper, site in ctx.inlined(window).items():
        if not isinstance(helper, FUNCS):
            continue
        params = [a.arg for a in (*helper.args.posonlyargs, *helper.args.args)]
        for param in params:
            arg = bound_argument(helper, site, param)
            if arg is None:
                continue
            d = division(arg)
            if d is None or not isinstance(d[0], ast.Constant) or not ctx.mentions_accum(d[1]) \
                    or _tail_sized(arg):
                continue
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                   and any(isinstance(side, ast.Name) and side.id == param for side in (n.left, n.right))
                   for n in walk_all(helper)):
                out.append((arg, d[0]))
    return out


@rule("AG141")
def tail_window_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    for window, facts in hand_for_windows(ctx):
        divisions = [d for d in divides_by_k(ctx, window) if not _tail_sized(d[0])] \
            or _scale_handed_to_helper(ctx, window)
        if not divisions:
            continue
        for call, kind in facts.steps:
            if kind != "optimizer":
                continue
            hit = _flush_guard(ctx, call, window)
            after = False
            if hit is None:
                pure = pure_mod_guard(ctx, call, window)
                after = pure is not None and _steps_after(ctx, window, call)
                if pure is None or not after:
                    continue
                hit = (pure[0], pure[1], _flag_value(ctx, pure[0].test, window))
            site, guard, test = hit
            ks = k_values(ctx, guard.modulus, site)
            if 1 in ks:
                continue
            k = next(iter(ks)) if len(ks) == 1 else None
            n = static_len(ctx, window.iter)
            if n is not None and k is not None and n % k == 0:
                continue  # no tail: every window is whole
            node = divisions[0][0]
            where = ("after the loop, on the micro-batches left" if after
                     else f"at the end of the pass (`{ast.unparse(test)}`)")
            head = (f"the step also runs {where}, "
                    f"but the loss is divided by K (`{ast.unparse(node)}`) in every micro-step: "
                    "the last window's r < K micro-batches reach the optimizer as r/K of their "
                    "mean gradient")
            if n is not None and k is not None:
                r = n % k
                yield replace(ctx.finding(
                    "AG141", node,
                    f"{head}; `{ast.unparse(window.iter)}` gives {n} micro-batches per pass, so the "
                    f"last window has {r} and its update is {r}/{k} of the large batch's"),
                    severity=Severity.ERROR, confidence=Confidence.HIGH)
                continue
            yield ctx.finding("AG141", node, f"{head} (the pass length is not in sight: no "
                              "tail when it is a multiple of K)")
            break


def _strided_start(loop: ast.AST) -> tuple[str, ast.AST, ast.AST] | None:
    """``for start in range(a, n, k):`` -> (the start's name, n, k)."""
    if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)
            and isinstance(loop.iter, ast.Call) and call_attr(loop.iter) == "range"
            and len(loop.iter.args) == 3):
        return None
    return loop.target.id, loop.iter.args[1], loop.iter.args[2]


def _cut_at_end(expr: ast.AST, start: str, k: ast.AST) -> bool:
    """``expr`` makes the window of micro-batches from ``start``: ``range(start, min(start
    + K, n))`` or a slice ``xs[start:start + K]`` (both give the pass's short tail)."""
    text = ast.unparse(k)
    for sub in walk_all(expr):
        if isinstance(sub, ast.Slice) and sub.lower is not None and sub.upper is not None \
                and ast.unparse(sub.lower) == start and text in ast.unparse(sub.upper):
            return True
        if isinstance(sub, ast.Call) and call_attr(sub) == "range" and len(sub.args) == 2 \
                and ast.unparse(sub.args[0]) == start and isinstance(sub.args[1], ast.Call) \
                and call_attr(sub.args[1]) == "min":
            return True
    return False


@rule("AG141")
def strided_tail_divided_by_k(ctx: FileContext) -> Iterator[Finding]:
    """``for start in range(0, n, K):`` over windows cut at the pass's end (``range(start,
    min(start + K, n))``, ``xs[start:start + K]``), each micro-batch's loss divided by the
    constant K and the optimizer stepped once per window: a last window of r = n % K < K
    micro-batches reaches the optimizer as r/K of its mean gradient."""
    for outer in ctx.of(ast.For):
        got = _strided_start(outer)
        if got is None:
            continue
        start, n_expr, k_expr = got
        if not ctx.mentions_accum(k_expr) and not isinstance(k_expr, ast.Name):
            continue
        cut = [st for st in outer.body if _cut_at_end(st, start, k_expr)]
        inner = [x for x in ctx.local_nodes(outer) if isinstance(x, ast.For) and x is not outer]
        steps = [c for c in ctx.local_nodes(outer) if isinstance(c, ast.Call)
                 and ctx.is_step(c)
                 and not any(c in set(walk_all(i)) for i in inner)]
        if not cut or not inner or not steps:
            continue
        k_text = ast.unparse(k_expr)
        for loop in inner:
            for node in ctx.local_nodes(loop):
                d = division(node)
                if d is None or ast.unparse(d[1]) != k_text or not flows_to_backward(ctx, node):
                    continue
                n = ctx.int_value(n_expr)
                k = ctx.int_value(k_expr)
                tail = f"; {n} micro-batches at K = {k} leave a last window of {n % k}" \
                    if n is not None and k else ""
                f = ctx.finding(
                    "AG141", node,
                    f"the windows are cut from `range({ast.unparse(outer.iter.args[0])}, "
                    f"{ast.unparse(n_expr)}, {k_text})` and the last one holds what is left of "
                    f"the pass, but every micro-batch's loss is divided by K (`{ast.unparse(node)}`) "
                    "and the optimizer steps on that window too: its r < K micro-batches reach "
                    f"the optimizer as r/K of their mean gradient{tail}",
                    fix="divide by the window's own size (`len(window)`) or by its sample/token "
                        "count")
                if n is not None and k and n % k == 0:
                    continue  # no tail
                yield replace(f, severity=Severity.ERROR, confidence=Confidence.HIGH) \
                    if n is not None and k else f
                break
            else:
                continue
            break


def _window_size_name(ctx: FileContext, arg: ast.AST, scope: ast.AST) -> bool:
    """``arg`` is a name the scope assigns once from a product with the accumulation count
    among its factors (``effective_batch = world * micro_bs * accum``): a full window's size,
    whatever the window's own length."""
    if not isinstance(arg, ast.Name):
        return False
    writes = assignments_by_name(ctx, scope).get(arg.id, [])
    if len(writes) != 1 or not isinstance(writes[0], ast.Assign):
        return False
    value = writes[0].value
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)):
        return False
    factors: list[ast.AST] = []
    stack: list[ast.AST] = [value]
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            stack += [e.left, e.right]
        else:
            factors.append(e)
    return any(ctx.mentions_accum(f) for f in factors)


def _divides_grads_by(helper: ast.AST, param: str) -> bool:
    """``helper`` touches ``.grad`` and divides a tensor by its parameter ``param``
    (``buf /= denom``, ``g.div_(denom)``, ``g / denom``)."""
    nodes = list(walk_all(helper))
    if not any(isinstance(n, ast.Attribute) and n.attr == "grad" for n in nodes):
        return False
    for n in nodes:
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) \
                and isinstance(n.value, ast.Name) and n.value.id == param:
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) \
                and isinstance(n.right, ast.Name) and n.right.id == param:
            return True
        if isinstance(n, ast.Call) and call_attr(n) in ("div_", "div") and n.args \
                and isinstance(n.args[0], ast.Name) and n.args[0].id == param:
            return True
    return False


@rule("AG141")
def tail_gradient_divided_by_window_size(ctx: FileContext) -> Iterator[Finding]:
    """The pass's short last window is stepped (``if (i + 1) % K == 0 or i + 1 == len(dl):``)
    and, in that branch, a function of the file divides the gradient by a full window's size
    (``sync_grads(model, effective_batch)``, ``effective_batch = W * micro * K``): the tail of
    r < K micro-batches reaches the optimizer as r/K of its mean gradient."""
    defs = ctx.defs_by_name()
    for window, facts in hand_for_windows(ctx):
        scope = ctx.scope_of(window)
        for call, kind in facts.steps:
            if kind != "optimizer":
                continue
            hit = _flush_guard(ctx, call, window)
            if hit is None:
                continue
            site, guard, test = hit
            if not isinstance(site, ast.If) or 1 in k_values(ctx, guard.modulus, site):
                continue
            for n in (x for stmt in site.body for x in walk_all(stmt)):
                if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Name):
                    continue
                helpers = defs.get(n.func.id, [])
                if len(helpers) != 1:
                    continue
                helper = helpers[0]
                params = [a.arg for a in (*helper.args.posonlyargs, *helper.args.args)]
                for param in params:
                    arg = bound_argument(helper, n, param)
                    if arg is None or not _window_size_name(ctx, arg, scope) \
                            or not _divides_grads_by(helper, param):
                        continue
                    yield ctx.finding(
                        "AG141", n,
                        f"the step also runs at the end of the pass (`{ast.unparse(test)}`), but "
                        f"`{ast.unparse(n)}` divides the window's gradient by `{ast.unparse(arg)}`, "
                        "a full window's size (the accumulation count among its factors), there "
                        "too: the last window's r < K micro-batches reach the optimizer as r/K of "
                        "their mean gradient (the pass length is not in sight: no tail when it is "
                        "a multiple of K)",
                        fix="divide by the samples (or tokens) the window actually had, summed over "
                            "the ranks, e.g. a count all-reduced at the boundary",
                    )
                    return
