"""AG148 (F1): a window's batches drawn from a prepared DataLoader before
``accelerator.accumulate`` runs on them, while the Accelerator syncs with the DataLoader.

Loops that normalise by the window's token count draw the window's K batches first
(``window = [next(it) for _ in range(K)]``), count, then run each inside
``with accelerator.accumulate(model):``. Accelerate's ``sync_with_dataloader`` (on by
default) makes every ``accumulate()`` a sync step once the prepared loader has yielded its
last batch; drawn ahead, the last window's batches all come after that moment, so the
optimizer steps on each of them: K updates, each on part of the window, instead of one. The
window may come from a generator of the file that groups the loader's batches by K (``for
win in windows(loader, K):``), which reads each window whole before its first micro-step.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import (
    FUNCS,
    call_attr,
    dotted,
    last_part,
    mult_factors,
    receiver,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.accelerate import names_k

__all__ = ["window_drawn_ahead_with_dataloader_sync"]

#: how many statements before the loop may build its window (it is built right before)
_NEAR = 8


def _keeps_dataloader_sync(ctx: FileContext) -> bool:
    """Nothing in the file turns ``sync_with_dataloader`` off or sets the sync by hand."""
    for call in ctx.of(ast.Call):
        for kw in call.keywords:
            if kw.arg == "sync_with_dataloader" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is True):
                return False
    return not any((n.attr == "sync_gradients" and isinstance(n.ctx, ast.Store))
                   or n.attr == "_set_sync_gradients" for n in ctx.of(ast.Attribute))


def _prepared_names(ctx: FileContext) -> set[str]:
    out: set[str] = set()
    for node in ctx.of(ast.Assign):
        v = node.value
        if isinstance(v, ast.Call) and call_attr(v) == "prepare" and ctx.is_accelerator(receiver(v)):
            for t in node.targets:
                out |= {d for x in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])
                        if (d := dotted(x)) is not None}
    return out


def _draws_from_prepared(ctx: FileContext, stmts: list[ast.stmt], prepared: set[str],
                         scope: ast.AST) -> ast.Call | None:
    """The ``next(it)`` among ``stmts`` whose iterator is ``iter(<prepared loader>)``."""
    def compute() -> dict[str, ast.AST]:
        out: dict[str, ast.AST] = {}
        for n in ctx.local_nodes(scope):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1):
                continue
            t, v = n.targets[0], n.value
            pairs = (list(zip(t.elts, v.elts, strict=True))  # `seen, it = [], iter(dl)`
                     if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple)
                     and len(t.elts) == len(v.elts) else [(t, v)])
            for name, value in pairs:
                if isinstance(name, ast.Name) and isinstance(value, ast.Call) \
                        and dotted(value.func) == "iter":
                    out[name.id] = value
        return out
    iters: dict[str, ast.AST] = ctx._cached("prefetch_iters", scope, compute)
    for stmt in stmts:
        for n in walk_all(stmt):
            if not (isinstance(n, ast.Call) and dotted(n.func) == "next" and n.args):
                continue
            src: ast.AST = n.args[0]
            if isinstance(src, ast.Name):
                src = iters.get(src.id, src)
            if isinstance(src, ast.Call) and dotted(src.func) == "iter" and src.args \
                    and dotted(src.args[0]) in prepared:
                return n
    return None


@rule("AG148")
def window_drawn_ahead_with_dataloader_sync(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.accelerate or not _keeps_dataloader_sync(ctx):
        return
    prepared = _prepared_names(ctx)
    if not prepared:
        return
    for with_ in ctx.of(ast.With):
        acc = next((i.context_expr for i in with_.items if isinstance(i.context_expr, ast.Call)
                    and call_attr(i.context_expr) == "accumulate"
                    and ctx.is_accelerator(receiver(i.context_expr))), None)
        if acc is None:
            continue
        loop = ctx.parents.get(with_)
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Name)):
            continue
        window = loop.iter.id
        block_owner = ctx.parents.get(loop)
        block = next((b for b in (getattr(block_owner, "body", None),
                                  getattr(block_owner, "orelse", None))
                      if isinstance(b, list) and loop in b), None)
        if block is None:
            continue
        # the statements before the loop that build the window (assign it, append to it)
        start = block.index(loop)
        builds = [s for s in block[max(0, start - _NEAR):start] if any(
            (isinstance(n, ast.Name) and n.id == window and isinstance(n.ctx, ast.Store))
            or (isinstance(n, ast.Call) and call_attr(n) == "append"
                and dotted(receiver(n)) == window) for n in walk_all(s))]
        scope = ctx.enclosing(loop, FUNCS) or ctx.tree
        drawn = _draws_from_prepared(ctx, builds, prepared, scope)
        grouped = None if drawn is not None else _grouping_generator(ctx, loop, window, prepared)
        if grouped is not None:
            drawn = grouped
        if drawn is None:
            continue
        # drawn until the loader ends (`next(it, None)`, or StopIteration caught; a generator
        # of the file grouping the loader's batches by K): the last batch is reached for
        # sure. A loop bounded by its own step count (`for update in range(n): window =
        # [next(it) ...]`) reaches it only if n x K batches are all the loader has: not in
        # sight, not reported
        whole = grouped is not None or len(drawn.args) > 1 or _catches_stop(ctx, drawn)
        counted = None if whole else _windows_of_loader(ctx, loop, prepared, scope)
        sized = None if whole or counted is not None else _data_sized_to_windows(ctx, loop)
        if not whole and counted is None and sized is None:
            continue
        finding = ctx.finding(
            "AG148",
            acc,
            f"the window `{window}` is drawn from the prepared DataLoader (`{ast.unparse(drawn)}`, "
            f"line {drawn.lineno}) before `{ast.unparse(acc)}` runs on its batches, and the "
            "Accelerator keeps sync_with_dataloader (its default): once the loader has yielded "
            "its last batch every accumulate() is a sync step, so the optimizer steps on each "
            "micro-batch of the last window (K updates, each on part of the window, instead "
            "of one)",
            fix="pass gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K, "
                "sync_with_dataloader=False) to the Accelerator, or draw each batch inside the "
                "window",
        )
        if counted is not None and not isinstance(counted, ast.Call):
            # `for _ in range(len(dl) // K)`: the last window reaches the loader's end only
            # when its length is a multiple of K, which the source does not say
            finding = replace(
                finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM,
                evidence=finding.evidence.replace(
                    "once the loader has yielded",
                    f"the loop runs `{ast.unparse(counted)}` windows, so whenever the loader's "
                    "length is a multiple of K the last window draws its last batch; once the "
                    "loader has yielded"))
        elif sized is not None:
            # `for u in range(N)` over data built with N x K x ... items: each rank's loader
            # holds N windows exactly, unless the dataset's length is not what it is given
            count, size = sized
            finding = replace(
                finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM,
                evidence=finding.evidence.replace(
                    "once the loader has yielded",
                    f"the loop runs `{ast.unparse(count)}` windows over data built with "
                    f"`{ast.unparse(size)}` items (line {getattr(size, 'lineno', '?')}), so the last window draws "
                    "the loader's last batch; once the loader has yielded"))
        yield finding


def _grouping_generator(ctx: FileContext, loop: ast.For, window: str,
                        prepared: set[str]) -> ast.Call | None:
    """``for window in group(loader, K):`` around the window's loop, ``group`` a generator
    of the file that iterates its loader parameter and yields lists of its batches: the
    call, when the loader given is a prepared one."""
    outer = ctx.enclosing(loop, (ast.For, ast.AsyncFor))
    if not (isinstance(outer, ast.For) and isinstance(outer.target, ast.Name)
            and outer.target.id == window and isinstance(outer.iter, ast.Call)):
        return None
    fn = ctx.callee_of(outer.iter)
    if fn is None:
        return None
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    given = [(params[i], a) for i, a in enumerate(outer.iter.args) if i < len(params)]
    loader = next((p for p, a in given if dotted(a) in prepared), None)
    if loader is None:
        return None
    walks = [n for n in ast.walk(fn) if isinstance(n, ast.For) and dotted(n.iter) == loader]
    yields = any(isinstance(n, ast.Yield) for w in walks for n in ast.walk(w))
    return outer.iter if walks and yields else None


def _data_sized_to_windows(ctx: FileContext, loop: ast.For) -> tuple[ast.AST, ast.AST] | None:
    """The loop around the window loop runs ``range(N)`` and a call of the file is given
    ``N * K * ...`` (``ToyDataset(N_UPDATES * GA * WORLD * BS)``): the data is sized to
    exactly N windows per rank."""
    outer = ctx.enclosing(loop, (ast.For, ast.AsyncFor, ast.While))
    if not (isinstance(outer, ast.For) and isinstance(outer.iter, ast.Call)
            and dotted(outer.iter.func) == "range" and len(outer.iter.args) == 1):
        return None
    count = outer.iter.args[0]
    name = _key(count)
    if name is None:
        return None
    hit = _sized_args(ctx).get(name)
    return (count, hit) if hit is not None else None


def _sized_args(ctx: FileContext) -> dict[str, ast.AST]:
    """Per name N: the first call argument of the file that multiplies N by K (``N * K *
    ...``, or a name its function assigns that product once); one pass per file, not one
    per window."""
    def compute() -> dict[str, ast.AST]:
        out: dict[str, ast.AST] = {}
        for call in ctx.of(ast.Call):
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if isinstance(arg, ast.Name):  # `n_rows = BS * K * W * N` then `make_rows(n_rows)`
                    values = ctx.assigned_in(ctx.scope_of(arg)).get(arg.id, [])
                    arg = values[0] if len(values) == 1 else arg
                factors = mult_factors(arg)
                if len(factors) > 1 and any(ctx.mentions_accum(f) or names_k(ctx, f)
                                            for f in factors):
                    for f in factors:
                        d = _key(f)
                        if d is not None:
                            out.setdefault(d, arg)
        return out
    return ctx._cached("prefetch_sized_args", ctx.tree, compute)  # type: ignore[no-any-return]


def _key(expr: ast.AST) -> str | None:
    """A name, a field, or a config entry (``CFG["steps"]``) as written; else None."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) \
            and isinstance(expr.slice.value, str) and dotted(expr.value) is not None:
        return ast.unparse(expr)
    return dotted(expr)


def _catches_stop(ctx: FileContext, node: ast.AST) -> bool:
    cur = ctx.parents.get(node)
    while cur is not None and not isinstance(cur, FUNCS):
        if isinstance(cur, ast.Try) and any(
                "StopIteration" in ast.unparse(h.type) for h in cur.handlers if h.type is not None):
            return True
        cur = ctx.parents.get(cur)
    return False


def _windows_of_loader(ctx: FileContext, loop: ast.For, prepared: set[str],
                       scope: ast.AST) -> ast.AST | None:
    """The loop around the window loop runs ``len(loader) // K`` times (directly or through a
    name its function assigns once), ``loader`` the prepared DataLoader or the one given to
    ``prepare``: its last window takes the loader's last batch when K divides its length."""
    outer = ctx.enclosing(loop, (ast.For, ast.AsyncFor, ast.While))
    if not (isinstance(outer, ast.For) and isinstance(outer.iter, ast.Call)
            and dotted(outer.iter.func) == "range" and len(outer.iter.args) == 1):
        return None
    count: ast.AST = outer.iter.args[0]
    if isinstance(count, ast.Name):
        # (the assignment that reaches the loop: a count recomputed after `prepare` split the
        # loader is the one the loop runs)
        write = ctx.reaching_write(scope, count.id, count)
        values = ctx.assigned_in(scope).get(count.id, [])
        count = write.value if isinstance(write, ast.Assign) and len(write.targets) == 1 else (
            values[0] if len(values) == 1 else count)
    given_count = count
    if isinstance(count, ast.Call) and last_part(dotted(count.func) or "") == "ceil" \
            and len(count.args) == 1 and isinstance(count.args[0], ast.BinOp) \
            and isinstance(count.args[0].op, ast.Div):
        count = ast.BinOp(count.args[0].left, ast.FloorDiv(), count.args[0].right)
        # (`math.ceil(len(dl) / K)`: the last window takes the loader's last batch always)
    if not (isinstance(count, ast.BinOp) and isinstance(count.op, ast.FloorDiv)
            and isinstance(count.left, ast.Call) and dotted(count.left.func) == "len"
            and count.left.args and ctx.mentions_accum(count.right)):
        return None
    loader = dotted(count.left.args[0])
    given: set[str] = ctx._cached("prefetch_given", ctx.tree, lambda: {
        d for c in ctx.of(ast.Call) if call_attr(c) == "prepare" and ctx.is_accelerator(receiver(c))
        for a in c.args if (d := dotted(a)) is not None})
    return given_count if loader in prepared | given else None
