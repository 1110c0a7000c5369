"""A sync decision that counts K in a window that may be shorter (F11): AG151.

Loops that group the loader into windows themselves (``for window in windows(loader, K):
for j, batch in enumerate(window):``) get a short last window whenever the epoch's length
is not a multiple of K. When the gradient sync is decided by comparing the position with
K (``model.no_sync() if j < K - 1 else nullcontext()``, ``require_backward_grad_sync = j ==
K - 1``, ``set_requires_gradient_sync(j == K - 1)``), a short window never reaches the
synchronising position: its last micro-batch skips the reduction and the optimizer steps
on each rank's own gradient. Reported when the file shows that windows can be short: the
window's generator yields a remainder after its loop (``if buf: yield buf``), or the loss
is divided by ``len(window)``. A warning: the damage needs an epoch whose length K does not
divide, which the source rarely states. Compare with ``len(window) - 1`` instead.

AG178 (F7 under FSDP2, F11 under DDP): the optimizer steps on ``flag or <tail>`` (``if
closes_window or i + 1 == n_total:``) while the gradient sync is decided by ``flag`` alone
(``set_requires_gradient_sync(closes_window)``): the window the tail test closes (an epoch's
short last one) is stepped on a gradient that was never reduced. Under FSDP2 the unsharded
gradient never reaches the sharded one the optimizer steps (that window's update is lost and
its gradient leaks into the next window); under DDP each rank steps on its own gradient.

AG342 (F11): inside the loop the sync is decided by a test true only at multiples of K
(``boundary = (i + 1) % K == 0``, ``no_sync()`` otherwise), and after the loop an optimizer
step applies the epoch's leftover micro-batches (``if len(loader) % K: step()``): their
backwards all ran under ``no_sync``, so each rank steps on its own gradient.

AG348 (F7): the same loop under FSDP2 (``set_requires_gradient_sync(flag)``, inline or in a
method of the file the loop hands the flag to), with the leftover thrown away after the loop
(``if len(loader) % K: opt.zero_grad()``) or stepped: FSDP2 keeps a backward's gradient that
was not reduce-scattered on the unsharded parameter, which ``zero_grad`` (of the optimizer or
the module: the sharded parameters) never reaches, and the next synchronised backward reduces
it with the next window's. Not reported when the loop can stop early (a ``break``: the
leftover may never run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, LOOPS, call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_SYNC_CALLS = frozenset({"no_sync", "set_requires_gradient_sync"})
_SYNC_FLAG = "require_backward_grad_sync"


def _yields_remainder(fn: ast.AST) -> bool:
    """A generator with a ``yield`` outside its loops, after one (``if buf: yield buf``)."""
    has_loop = False
    for n in ast.walk(fn):
        if isinstance(n, LOOPS):
            has_loop = True
    if not has_loop:
        return False
    stack: list[tuple[ast.AST, bool]] = [(fn, False)]
    while stack:
        node, in_loop = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (*FUNCS, ast.Lambda)):
                continue
            if isinstance(child, ast.Yield) and not in_loop:
                return True
            stack.append((child, in_loop or isinstance(child, LOOPS)))
    return False


def _window_may_be_short(ctx: FileContext, outer: ast.For, inner: ast.For, window: str) -> str | None:
    """Why the file shows windows shorter than K, or None."""
    if isinstance(outer.iter, ast.Call) and (fn := ctx.callee_of(outer.iter)) is not None \
            and _yields_remainder(fn):
        return f"`{fn.name}` yields the remainder after its loop as a last, shorter window"
    for n in ast.walk(inner):
        if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv)
                and isinstance(n.right, ast.Call) and dotted(n.right.func) == "len"
                and n.right.args and dotted(n.right.args[0]) == window):
            return f"the loss is divided by `{ast.unparse(n.right)}`"
    return None


def _branches(n: ast.IfExp | ast.If) -> Iterator[ast.AST]:
    if isinstance(n, ast.IfExp):
        yield from (c for b in (n.body, n.orelse) for c in ast.walk(b))
    else:
        yield from (c for s in n.body for c in ast.walk(s))


def _sync_tests(ctx: FileContext, inner: ast.For, index: str) -> Iterator[ast.Compare]:
    """Comparisons of ``index`` with K that decide the sync in ``inner``."""
    for n in ast.walk(inner):
        decided: ast.AST | None = None
        if isinstance(n, ast.IfExp | ast.If) and any(
                isinstance(c, ast.Call) and call_attr(c) in _SYNC_CALLS for c in _branches(n)):
            decided = n.test
        elif isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == _SYNC_FLAG for t in n.targets):
            decided = n.value
        elif isinstance(n, ast.Call) and call_attr(n) == "set_requires_gradient_sync" and n.args:
            decided = n.args[0]
        if decided is None:
            continue
        for c in ast.walk(decided):
            if (isinstance(c, ast.Compare) and any(isinstance(x, ast.Name) and x.id == index
                                                   for x in ast.walk(c))
                    and any(ctx.mentions_accum(x) for x in [c.left, *c.comparators])
                    and "len(" not in ast.unparse(c)):
                yield c


@rule("AG151")
def sync_counts_k_in_short_window(ctx: FileContext) -> Iterator[Finding]:
    for inner in ctx.of(ast.For):
        it = inner.iter
        if not (isinstance(it, ast.Call) and dotted(it.func) == "enumerate" and it.args
                and isinstance(it.args[0], ast.Name) and isinstance(inner.target, ast.Tuple)
                and inner.target.elts and isinstance(inner.target.elts[0], ast.Name)):
            continue
        window, index = it.args[0].id, inner.target.elts[0].id
        outer = ctx.enclosing(inner, (ast.For,))
        if not (isinstance(outer, ast.For) and isinstance(outer.target, ast.Name)
                and outer.target.id == window):
            continue
        tests = list(_sync_tests(ctx, inner, index))
        why = _window_may_be_short(ctx, outer, inner, window) if tests else None
        if why is None:
            continue
        for test in tests:
            yield ctx.finding(
                "AG151",
                test,
                f"the gradient sync is decided by `{ast.unparse(test)}`, a position counted "
                f"against K, but windows can be shorter ({why}): a short window never reaches "
                "that position, its last micro-batch skips the reduction, and the optimizer "
                "steps on each rank's own gradient",
            )


def _sync_flag_names(loop: ast.AST) -> dict[str, ast.AST]:
    """Names that alone decide the sync in ``loop`` (``set_requires_gradient_sync(flag)``,
    ``model.require_backward_grad_sync = flag``), each with that call or assignment."""
    out: dict[str, ast.AST] = {}
    for n in ast.walk(loop):
        if isinstance(n, ast.Call) and call_attr(n) == "set_requires_gradient_sync" and n.args \
                and isinstance(n.args[0], ast.Name):
            out[n.args[0].id] = n
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and any(
                isinstance(t, ast.Attribute) and t.attr == _SYNC_FLAG for t in n.targets):
            out[n.value.id] = n
    return out


@rule("AG178")
def step_test_wider_than_sync(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For):
        flags = _sync_flag_names(loop)
        if not flags:
            continue
        for test_if in ast.walk(loop):
            if not (isinstance(test_if, ast.If) and isinstance(test_if.test, ast.BoolOp)
                    and isinstance(test_if.test.op, ast.Or)):
                continue
            names = [v.id for v in test_if.test.values if isinstance(v, ast.Name)]
            flag = next((f for f in names if f in flags), None)
            if flag is None or len(test_if.test.values) < 2:
                continue
            steps = [c for st in test_if.body for c in ast.walk(st)
                     if isinstance(c, ast.Call) and call_attr(c) == "step"
                     and ctx.kind_of_receiver(receiver(c)) == "optimizer"]
            if not steps:
                continue
            values = ctx.assigned_in(ctx.scope_of(test_if)).get(flag, [])
            extra = [v for v in test_if.test.values
                     if not (isinstance(v, ast.Name) and v.id == flag)]
            if len(values) != 1 or any(ast.dump(e) in {ast.dump(x) for x in ast.walk(values[0])}
                                       for e in extra):
                continue  # the flag holds the extra case too
            decided = flags[flag]
            fsdp = isinstance(decided, ast.Call)
            shown = " or ".join(f"`{ast.unparse(e)}`" for e in extra)
            yield ctx.finding(
                "AG178",
                test_if.test,
                f"the optimizer steps on `{ast.unparse(test_if.test)}`, but the gradient is "
                f"synchronised on `{flag}` (= `{ast.unparse(values[0])}`) alone (line "
                f"{getattr(decided, 'lineno', '?')}): on {shown} (an epoch's short last window) the step runs "
                "on a gradient that was never reduced"
                + (": FSDP2 keeps it unsharded, so that window's update is lost and its "
                   "gradient leaks into the next window" if fsdp else
                   ": each rank steps on its own gradient, and the ranks drift apart"),
                fix=f"synchronise on the same test the step uses: `{flag} = "
                    f"{ast.unparse(values[0])} or {' or '.join(ast.unparse(e) for e in extra)}`",
            )


def _sync_decider(loop: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(what decides the sync in ``loop``, where): the test of an ``if``/conditional choosing
    ``no_sync()``, the value assigned to ``require_backward_grad_sync``, or the argument of
    ``set_requires_gradient_sync``."""
    for n in ast.walk(loop):
        if isinstance(n, ast.IfExp | ast.If) and any(
                isinstance(c, ast.Call) and call_attr(c) in _SYNC_CALLS for c in _branches(n)):
            return n.test, n
        if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == _SYNC_FLAG for t in n.targets):
            return n.value, n
        if isinstance(n, ast.Call) and call_attr(n) == "set_requires_gradient_sync" and n.args:
            return n.args[0], n
    return None


def _fsdp2_flag_handed_down(ctx: FileContext, loop: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(the argument, the call) when a call in ``loop`` hands a value to a function of the
    file that passes that parameter to ``set_requires_gradient_sync`` (``self.micro_step(batch,
    sync=boundary)``)."""
    for call in ast.walk(loop):
        if not isinstance(call, ast.Call) or (fn := ctx.callee_of(call)) is None:
            continue
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        offset = 1 if params and params[0] in ("self", "cls") else 0
        for inner in ast.walk(fn):
            if not (isinstance(inner, ast.Call) and call_attr(inner) == "set_requires_gradient_sync"
                    and inner.args and isinstance(inner.args[0], ast.Name)
                    and inner.args[0].id in params):
                continue
            name = inner.args[0].id
            given = next((k.value for k in call.keywords if k.arg == name), None)
            i = params.index(name) - offset
            if given is None and 0 <= i < len(call.args) and not any(
                    isinstance(a, ast.Starred) for a in call.args[:i + 1]):
                given = call.args[i]
            if given is not None:
                return given, call
    return None


def _multiples_of_k_only(ctx: FileContext, test: ast.AST, scope: ast.AST) -> bool:
    """``test`` (or the one value of the name it is) is true only at multiples of K:
    ``(i + 1) % K == 0`` with no ``or`` for an epoch's last micro-batch."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return False
    if isinstance(test, ast.Name):
        values = ctx.assigned_in(scope).get(test.id, [])
        if len(values) != 1:
            return False
        test = values[0]
    return (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and any(isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod)
                    and ctx.mentions_accum(m.right) for m in ast.walk(test.left)))


def _steps(ctx: FileContext, stmt: ast.AST) -> list[tuple[ast.Call, str]]:
    """The optimizer steps ``stmt`` runs, each with what it steps: ``opt.step()`` (the
    optimizer's name), or a call of a function of the file whose body makes one (the
    function's name)."""
    out = []
    for c in ast.walk(stmt):
        if not isinstance(c, ast.Call):
            continue
        if call_attr(c) == "step" and ctx.kind_of_receiver(receiver(c)) == "optimizer":
            out.append((c, dotted(receiver(c)) or "?"))
            continue
        fn = ctx.callee_of(c)
        if fn is not None and any(
                isinstance(s, ast.Call) and call_attr(s) == "step"
                and ctx.kind_of_receiver(receiver(s)) == "optimizer" for s in ast.walk(fn)):
            out.append((c, f"{fn.name}()"))
    return out


def _between(ctx: FileContext, node: ast.AST, top: ast.AST) -> Iterator[ast.AST]:
    """The ancestors of ``node`` up to ``top`` (``top`` included)."""
    cur = ctx.parents.get(node)
    while cur is not None:
        yield cur
        if cur is top:
            return
        cur = ctx.parents.get(cur)


@rule("AG342")
def tail_stepped_after_unsynced_loop(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For):
        parent = ctx.parents.get(loop)
        body = next((b for b in (getattr(parent, f, None) for f in ("body", "orelse"))
                     if isinstance(b, list) and loop in b), None)
        decided = _sync_decider(loop)
        inside = {what for _, what in _steps(ctx, loop)}
        if body is None or decided is None or not inside:
            continue
        test, where = decided
        if isinstance(where, ast.Call) or not _multiples_of_k_only(ctx, test, ctx.scope_of(loop)):
            continue  # (FSDP2's flag: the leftover's update is lost instead, AG178's wording)
        values = ctx.assigned_in(ctx.scope_of(loop)).get(test.id, []) \
            if isinstance(test, ast.Name) else []
        shown = f"`{ast.unparse(test)}`" + (f" (= `{ast.unparse(values[0])}`)" if values else "")
        after = [st for st in body[body.index(loop) + 1:] if not isinstance(st, LOOPS)]
        # (the same optimizer, outside any later loop: a reference run's is another)
        step = next((c for st in after for c, what in _steps(ctx, st) if what in inside
                     and not any(isinstance(a, LOOPS) for a in _between(ctx, c, st))), None)
        if step is None:
            continue
        yield ctx.finding(
            "AG342", step,
            f"this step after the loop applies the epoch's leftover micro-batches, but inside "
            f"the loop the gradient is synchronised only on {shown} (line "
            f"{getattr(where, 'lineno', '?')}), true at multiples of K: the leftover "
            "micro-batches' backwards all ran without the reduction, so each rank steps on its "
            "own gradient and the ranks drift apart",
            fix="synchronise the epoch's last micro-batch too (`boundary = (i + 1) % K == 0 or "
                "i + 1 == len(loader)`), and step it inside the loop")


def _after_the_loop(ctx: FileContext, loop: ast.For) -> list[ast.stmt]:
    """The statements after ``loop`` in its block, other loops left out."""
    parent = ctx.parents.get(loop)
    body = next((b for b in (getattr(parent, f, None) for f in ("body", "orelse"))
                 if isinstance(b, list) and loop in b), None)
    return [] if body is None else [st for st in body[body.index(loop) + 1:] if not isinstance(st, LOOPS)]


def _cut_to_whole_windows(ctx: FileContext, loop: ast.For) -> bool:
    """The loop runs over a slice (``batches[: len(batches) // K * K]``, ``islice(...)``),
    directly or through a name assigned one in its function: cut, most likely, to whole
    windows, so there may be no leftover."""
    it: ast.AST = loop.iter
    while isinstance(it, ast.Call) and dotted(it.func) in ("enumerate", "zip") and it.args:
        it = it.args[0]
    values = ctx.assigned_in(ctx.scope_of(loop)).get(it.id, []) if isinstance(it, ast.Name) else [it]
    return any((isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Slice)) or (
        isinstance(v, ast.Call) and (dotted(v.func) or "").endswith("islice")) for v in values)


@rule("AG348")
def fsdp2_tail_left_unsharded(ctx: FileContext) -> Iterator[Finding]:
    if not any(call_attr(c) == "set_requires_gradient_sync" for c in ctx.of(ast.Call)):
        return  # (FSDP2's flag nowhere in the file)
    for loop in ctx.of(ast.For):
        decided = _sync_decider(loop)
        if decided is None or not isinstance(decided[1], ast.Call):
            decided = _fsdp2_flag_handed_down(ctx, loop)
        inside = {what for _, what in _steps(ctx, loop)}
        if decided is None or not inside or any(isinstance(n, ast.Break) for n in ast.walk(loop)) \
                or _cut_to_whole_windows(ctx, loop):
            continue
        test, where = decided
        if not (isinstance(where, ast.Call) and (call_attr(where) == "set_requires_gradient_sync"
                                                 or ctx.callee_of(where) is not None)):
            continue
        if not _multiples_of_k_only(ctx, test, ctx.scope_of(loop)):
            continue
        for st in _after_the_loop(ctx, loop):
            if any(isinstance(n, ast.Call) and call_attr(n) in ("backward", "set_requires_gradient_sync")
                   for n in ast.walk(st)):
                break  # a backward (or a sync) after the loop: what it reduces is out of sight
            hit = next((c for c in ast.walk(st) if isinstance(c, ast.Call) and (
                call_attr(c) == "zero_grad" or any(c is s for s, _ in _steps(ctx, st)))
                and not any(isinstance(a, LOOPS) for a in _between(ctx, c, st))), None)
            if hit is None:
                continue
            what = "throws" if call_attr(hit) == "zero_grad" else "steps"
            yield ctx.finding(
                "AG348", hit,
                f"this {'zero_grad' if what == 'throws' else 'step'} after the loop {what} the "
                "epoch's leftover micro-batches, but inside the loop FSDP2's gradient sync is on "
                f"`{ast.unparse(test)}` only (line {getattr(where, 'lineno', '?')}), true at "
                "multiples of K: the leftover's backwards ran under "
                "set_requires_gradient_sync(False), so FSDP2 holds their gradient on the "
                "unsharded parameters, outside the sharded .grad "
                + ("zero_grad clears" if what == "throws" else "the optimizer steps")
                + ", and the next synchronised backward reduces it into the next window")
            break
