"""Whether a window's accumulation names only build its batch: the large-batch reference's
loop (each iteration gathers a whole window's micro-batches into one batch: one backward, one
step, K = 1), told from a loop over micro-batches. Used by :mod:`._ctx_windows`."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from typing import Protocol

from accumguard.static.lint._ast import (
    ACCUM_RE,
    call_attr,
    dotted,
    has_mod,
    identifiers,
    is_backward,
    mult_factors,
    walk_all,
    walk_local,
)


class WindowQueries(Protocol):
    """What the shape test reads of the file's context (:class:`._ctx_windows.WindowQueries`)."""

    @property
    def parents(self) -> Mapping[ast.AST, ast.AST]: ...

    def inlined(self, window: ast.AST) -> Mapping[ast.AST, ast.AST]: ...
    def local_nodes(self, node: ast.AST) -> Iterable[ast.AST]: ...
    def _mod_flag(self, test: ast.AST, scope: ast.AST) -> bool: ...
    def _scope_shows_accumulation(self, node: ast.AST,
                                  skip: frozenset[ast.AST] = frozenset()) -> bool: ...
    def _gates_step(self, node: ast.If) -> bool: ...
    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None: ...
    def mentions_accum(self, expr: ast.AST) -> bool: ...
    def sized_by_accum(self, expr: ast.AST, depth: int = 2) -> bool: ...
    def assignments(self) -> list[tuple[list[str], ast.AST]]: ...
    def sole_values_by_name(self) -> dict[str, list[ast.AST]]: ...
    def functions_by_name(self) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]: ...


__all__ = ["MICRO_ITER_RE", "accum_name", "accum_only_builds_batch", "assembles_window", "iter_identifiers",
           "steps_by_window", "whole_window_iteration", "yields_windows"]

#: a loop over these iterates the micro-batches of one window
MICRO_ITER_RE = re.compile(r"window(?!s)|micro|chunk|accum")

_ACCUM_NAMES: dict[str, bool] = {}


def accum_name(ident: str) -> bool:
    """``ACCUM_RE`` on an identifier, memoised (a big file repeats the same few names)."""
    hit = _ACCUM_NAMES.get(ident)
    if hit is None:
        hit = ident != "accumulate" and ACCUM_RE.search(ident) is not None
        if len(_ACCUM_NAMES) < 100_000:
            _ACCUM_NAMES[ident] = hit
    return hit


def accum_only_builds_batch(ctx: WindowQueries, window: ast.AST) -> bool:
    """Every accumulation name of the window's own code is inside a comprehension, a
    subscript's slice, the window loop's iterable or an inner loop with no backward, and
    the window calls no ``no_sync``/``accumulate`` and gates no step by a modulo (those
    say accumulation wherever the names are); no backward helper it calls shows
    accumulation itself."""
    inlined = ctx.inlined(window)
    if any(ctx._scope_shows_accumulation(h) for h in inlined):
        return False  # the backward helper gates its own step or names K itself
    helper_names = {c.func for c in inlined.values() if isinstance(c, ast.Call)}  # `micro(xs, ys)`: a helper's name
    found = False
    for sub in ctx.local_nodes(window):
        if sub in helper_names:
            continue
        if isinstance(sub, ast.If) and (has_mod(sub.test) or ctx._mod_flag(sub.test, window)) \
                and ctx._gates_step(sub):
            return False
        if isinstance(sub, ast.Call) and call_attr(sub) in ("no_sync", "accumulate",
                                                            "no_backward_sync"):
            return False
        name = sub.id if isinstance(sub, ast.Name) else \
            sub.attr if isinstance(sub, ast.Attribute) else None
        if name is None or not (accum_name(name.lower()) or (
                isinstance(sub, ast.Name) and ctx.mentions_accum(sub))):
            continue  # (`K = CONFIG["accum"]`: K is a name of the accumulation count too)
        found = True
        if not _builds_batch(ctx, sub, window):
            return False
    return found


def _builds_batch(ctx: WindowQueries, node: ast.AST, window: ast.AST) -> bool:
    parent = ctx.parents.get(node)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) \
            and isinstance(parent, ast.Assign) and node in parent.targets \
            and isinstance(parent.value, ast.ListComp | ast.GeneratorExp):
        return True  # `micro = [mb for r in data[step] for mb in r]`: the window's items
    child, cur = node, parent
    while cur is not None and child is not window:
        if isinstance(cur, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            return True
        if isinstance(cur, ast.Subscript) and child is cur.slice:
            return True
        if isinstance(cur, ast.Subscript) and child is cur.value and _window_slice(cur, window):
            return True  # micro_batches[step * K:(step + 1) * K]: one whole window's items
        if isinstance(cur, ast.For | ast.AsyncFor) and (
                child is cur.iter if cur is window else
                not any(isinstance(n, ast.Call) and is_backward(n) for n in walk_all(cur))):
            return True
        child, cur = cur, ctx.parents.get(cur)
    return False


def _window_slice(sub: ast.Subscript, window: ast.AST) -> bool:
    """``items[a:b]`` with both bounds built from the window loop's own variable: each
    iteration takes a whole window of items (the large-batch reference)."""
    target = getattr(window, "target", None)
    names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target else set()
    sl = sub.slice
    return bool(names) and isinstance(sl, ast.Slice) and sl.lower is not None \
        and sl.upper is not None and all(
            any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(b))
            for b in (sl.lower, sl.upper))


def steps_by_window(ctx: WindowQueries, it: ast.AST) -> bool:
    """``range(start, stop, K)`` or ``range(n // K)``: each iteration is a whole window (the
    large-batch reference's loop), not one micro-batch. K is a name saying so, one the
    file knows as K (``range(0, n_micro, K)`` with ``K = args.accum``), or any stride over a
    count of micro-batches."""
    if not (isinstance(it, ast.Call) and dotted(it.func) == "range" and it.args):
        return False
    if len(it.args) == 3:
        # (a stride over micro-batch positions, `range(0, n_micro, K)` whatever K is called:
        # each iteration starts a run of K of them)
        return any(MICRO_ITER_RE.search(i) for i in identifiers(it.args[2])) \
            or ctx.mentions_accum(it.args[2]) or (
                any(MICRO_ITER_RE.search(i) for i in identifiers(it.args[1]))
                and not (isinstance(it.args[2], ast.Constant) and it.args[2].value == 1))
    stop = it.args[-1]
    return (len(it.args) == 1 and isinstance(stop, ast.BinOp) and isinstance(stop.op, ast.FloorDiv)
            and (any(MICRO_ITER_RE.search(i) for i in identifiers(stop.right))
                 or ctx.mentions_accum(stop.right)))


#: a call that yields whole windows of K items (``windows(loader, K)``): its K sizes them
_WINDOWS_CALL_RE = re.compile(r"windows$|_groups$|^groups$|batched$")


def yields_windows(ctx: WindowQueries, it: ast.AST) -> bool:
    """``it`` calls a generator function of the file (one definition) each of whose
    ``yield``s hands out a slice sized by K (``yield w, micro[w * accum:(w + 1) * accum]``):
    the loop over it runs whole windows, whatever the generator is called."""
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)):
        return False
    defs = ctx.functions_by_name().get(it.func.id, [])
    if len(defs) != 1:
        return False
    yields = [n for n in walk_local(defs[0]) if isinstance(n, ast.Yield | ast.YieldFrom)]
    return bool(yields) and all(
        isinstance(y, ast.Yield) and y.value is not None and any(
            isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Slice)
            and ctx.sized_by_accum(sub.slice) for sub in walk_all(y.value))
        for y in yields)


def iter_identifiers(it: ast.AST) -> list[str]:
    """The identifiers of a loop's iterable, without the arguments of a call that yields
    whole windows (``zip(*[windows(l, grad_accum) for l in loaders])`` iterates windows:
    its K is their size, not a sign that the loop runs over micro-batches)."""
    skip: set[int] = set()
    for c in walk_all(it):
        if isinstance(c, ast.Call) and _WINDOWS_CALL_RE.search((call_attr(c) or "").lower()):
            skip |= {id(x) for a in [*c.args, *c.keywords] for x in walk_all(a)}
    return [x.id.lower() if isinstance(x, ast.Name) else x.attr.lower() for x in walk_all(it)
            if id(x) not in skip and isinstance(x, ast.Name | ast.Attribute)]


def whole_window_iteration(ctx: WindowQueries, window: ast.AST) -> bool:
    """Each iteration is one whole window (a large-batch reference): the loop takes its data
    by a range or slice sized with K (``win = bs * K * W``; ``xs[s * win:(s + 1) * win]``;
    ``[batch(s, m) for m in range(K)]``) or strides over the micro-batch positions
    (``range(0, n_micro, K)``), does not run K iterations nor divide its loss by
    K, and has every backward in its body. Its step, zero_grad and clipping are once per
    window, not per micro-step."""
    if not isinstance(window, ast.For | ast.AsyncFor):
        return False
    backs = [n for n in walk_local(window) if isinstance(n, ast.Call) and call_attr(n) == "backward"]
    if not backs or any(ctx.enclosing(b, (ast.For, ast.AsyncFor, ast.While)) is not window for b in backs):
        return False
    counts = _data_counts(window)
    if _k_iterations(ctx, window.iter) or any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and ctx.mentions_accum(n.right)
            and not (isinstance(n.right, ast.Name) and n.right.id in counts)
            for n in walk_local(window)):
        return False  # K iterations, or a loss divided by K: micro-steps (F1 stays)
    bounds = [n for stmt in window.body for n in walk_local(stmt)
              if (isinstance(n, ast.Call) and (call_attr(n) == "range" or dotted(n.func) == "slice"))
              or isinstance(n, ast.Slice)]
    return steps_by_window(ctx, window.iter) or any(ctx.sized_by_accum(b) for b in bounds)


#: reductions whose result counts data (``(labels[sl] != -100).sum()``), not K
_COUNTS = frozenset({"sum", "numel", "count_nonzero", "len"})


def _data_counts(window: ast.AST) -> set[str]:
    """Names the loop assigns once from a count of data (``n = (y[sl] != -100).sum()``,
    ``n = len(batch)``): a divisor that reads K only through the slice it counts over."""
    writes: dict[str, list[ast.AST]] = {}
    for n in walk_local(window):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            writes.setdefault(n.targets[0].id, []).append(n.value)
    return {name for name, values in writes.items() if len(values) == 1
            and isinstance(values[0], ast.Call) and call_attr(values[0]) in _COUNTS}


def _k_iterations(ctx: WindowQueries, it: ast.AST) -> bool:
    """The loop's iterable is sized by K (``range(K)``, ``batch.chunk(K)``), not a number
    of windows (``range(n // K)``, ``range(n_windows)`` with ``n_windows = len(x) // K``,
    ``range(0, n, K)``): K, or a name made from it, outside the right side of a division
    and a range's stride."""
    under_div = {id(x) for n in walk_all(it)
                 if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv)
                 for x in walk_all(n.right)}
    if steps_by_window(ctx, it):
        return False  # `range(0, n_micro, K)`, `range(n_micro // K)`: a number of windows
    for n in walk_all(it):
        if id(n) in under_div or not isinstance(n, ast.Name | ast.Attribute | ast.Subscript):
            continue
        if ctx.mentions_accum(n) and not _windows_count(ctx, n):
            return True
    return False


def _windows_count(ctx: WindowQueries, name: ast.AST) -> bool:
    """``n_windows`` assigned (only) from a division by K: a number of windows."""
    d = dotted(name)
    values = ctx.sole_values_by_name().get(d, []) if d else []
    return bool(values) and all(
        isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div | ast.FloorDiv)
        and ctx.mentions_accum(v.right) for v in values)


def assembles_window(node: ast.AST) -> bool:
    """K named where a loop builds or sizes one large batch rather than runs K backwards:
    inside a comprehension (``[sample(s * K + k) for k in range(K)]``, the window's
    micro-batches concatenated) or a product with other names (``n / (micro * K * world)``,
    the window's sample count): a large-batch reference's loop."""
    if isinstance(node, ast.ListComp | ast.GeneratorExp | ast.SetComp | ast.DictComp):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and sum(
        1 for f in mult_factors(node) if not isinstance(f, ast.Constant)) >= 3
