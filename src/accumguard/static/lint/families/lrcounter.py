"""AG130 (F4): a learning rate written into ``param_groups`` from a counter of micro-batches.

nanoGPT-style loops set the learning rate by hand — ``lr = get_lr(it)`` then
``for g in optimizer.param_groups: g["lr"] = lr`` — with a schedule whose constants
(``warmup_iters``, ``lr_decay_iters``) are counted in optimizer steps. When ``it`` is
incremented once per *micro-batch* (``it += 1`` in the accumulation window, or the flat
loop's own index when the step is gated by ``% K``), the schedule advances K positions per
optimizer step: warm-up ends K times early and the decay reaches its floor after 1/K of the
run. An error when the schedule's horizon is tied to the loop's count of optimizer steps
in the source (a name or integer the schedule reads also bounds the loop around the window:
``while step < max_iters`` and ``lr_decay_iters = max_iters``); a warning when that tie is
not in sight (the constants may have been counted in micro-batches on purpose). Silent when
the counter is divided before the call (``get_lr(it // K)``), when a constant the schedule
reads is built from K (``lr_decay_iters = max_iters * grad_accum``), or when the counter
is incremented once per optimizer step (nanoGPT's own loop).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, dotted, sum_terms, walk_all, walk_local
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import lambda_body
from accumguard.static.lint.families.deepspeed import _name_values

__all__ = ["lambda_from_lightning_loop_counter", "lr_from_lightning_batch_idx", "lr_from_micro_counter", "update_counter_started_from_micro_batches"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _lr_writes(ctx: FileContext) -> Iterator[ast.Assign]:
    """``group["lr"] = value`` (a param group's learning rate written by hand)."""
    for node in ctx.of(ast.Assign):
        for t in node.targets:
            if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "lr"):
                yield node


def _single_defs(ctx: FileContext) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    def compute() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for fn in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef):
            defs.setdefault(fn.name, []).append(fn)
        return {k: v[0] for k, v in defs.items() if len(v) == 1}
    return ctx._cached("lr_single_defs", ctx.tree, compute)  # type: ignore[no-any-return]


def _int_of(ctx: FileContext, name: str) -> int | None:
    """The one integer literal every assignment of ``name`` gives it (tuple assignments
    ``a, b = 2, 8`` paired), else None."""
    def compute() -> dict[str, set[int | None]]:
        out: dict[str, set[int | None]] = {}
        for node in ctx.of(ast.Assign):
            for t in node.targets:
                pairs: list[tuple[ast.AST, ast.AST | None]] = [(t, node.value)]
                if isinstance(t, ast.Tuple | ast.List):
                    vals = node.value.elts if isinstance(node.value, ast.Tuple | ast.List) else []
                    pairs = [(x, vals[i] if len(vals) == len(t.elts) else None) for i, x in enumerate(t.elts)]
                for x, v in pairs:
                    if isinstance(x, ast.Name):
                        iv = v.value if isinstance(v, ast.Constant) and type(v.value) is int else None
                        out.setdefault(x.id, set()).add(iv)
        return out
    values = ctx._cached("lr_int_of", ctx.tree, compute).get(name, set())
    return next(iter(values)) if len(values) == 1 and None not in values else None




def _innermost_loop(ctx: FileContext, node: ast.AST, scope: ast.AST) -> ast.AST | None:
    return ctx.enclosing(node, _LOOPS) if ctx.scope_of(node) is scope else None


def _accumulating_windows(ctx: FileContext) -> set[ast.AST]:
    def compute() -> set[ast.AST]:
        return {w for w in ctx.windows() if ctx.window_facts(w).accumulating}
    return ctx._cached("lr_acc_windows", ctx.tree, compute)  # type: ignore[no-any-return]


def _writes(ctx: FileContext, scope: ast.AST) -> dict[str, tuple[list[ast.AugAssign], list[ast.Assign]]]:
    """Per name of ``scope``: its augmented assignments and its plain assignments (one walk)."""
    def compute() -> dict[str, tuple[list[ast.AugAssign], list[ast.Assign]]]:
        out: dict[str, tuple[list[ast.AugAssign], list[ast.Assign]]] = {}
        for n in walk_local(scope):
            if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                out.setdefault(n.target.id, ([], []))[0].append(n)
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, ([], []))[1].append(n)
        return out
    return ctx._cached("lr_writes", scope, compute)  # type: ignore[no-any-return]


def _flat_windows(ctx: FileContext) -> dict[str, list[ast.For | ast.AsyncFor]]:
    """Accumulating ``for`` windows by the name of their index (``for it, b in enumerate(...)``)."""
    def compute() -> dict[str, list[ast.For | ast.AsyncFor]]:
        out: dict[str, list[ast.For | ast.AsyncFor]] = {}
        accumulating = _accumulating_windows(ctx)
        for w in ctx.windows():  # source order: the first window wins, whatever the set's order
            if w in accumulating and isinstance(w, ast.For | ast.AsyncFor):
                tgt = w.target.elts[0] if isinstance(w.target, ast.Tuple) and w.target.elts else w.target
                if isinstance(tgt, ast.Name):
                    out.setdefault(tgt.id, []).append(w)
        return out
    return ctx._cached("lr_flat_windows", ctx.tree, compute)  # type: ignore[no-any-return]


def _micro_window(ctx: FileContext, scope: ast.AST, counter: str) -> ast.AST | None:
    return ctx._cached("lr_micro:" + counter, scope,  # type: ignore[no-any-return]
                       lambda: _micro_window_uncached(ctx, scope, counter))


def _micro_window_uncached(ctx: FileContext, scope: ast.AST, counter: str) -> ast.AST | None:
    """The accumulating window in which ``counter`` counts micro-batches: it is incremented
    (``+= 1``) on every micro-batch of the window, never at the boundary, and never reset in a
    loop; or it is the index of a flat window whose optimizer step is gated by a boundary."""
    windows = _accumulating_windows(ctx)
    incs, resets = _writes(ctx, scope).get(counter, ([], []))
    if not incs and len(resets) == 1:
        derived = _derived_from_index(ctx, scope, resets[0])
        if derived is not None:
            return derived
    if any(ctx.enclosing(r, _LOOPS) is not None and ctx.scope_of(r) is scope for r in resets):
        return None
    if incs:
        loops = {_innermost_loop(ctx, n, scope) for n in incs}
        if len(loops) != 1 or any(not (isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant)
                                       and n.value.value == 1) for n in incs):
            return None
        window = loops.pop()
        if window in windows and not any(ctx.guarded(n, window) for n in incs):
            return window
        return None
    for w in _flat_windows(ctx).get(counter, []):
        if ctx.scope_of(w) is not scope or _micro_index(ctx, w.iter):
            continue
        facts = ctx.window_facts(w)
        opt_steps = [c for c, kind in facts.steps if kind == "optimizer"]
        if opt_steps and not facts.unguarded_optimizer_steps:
            return w
    return None


def _derived_from_index(ctx: FileContext, scope: ast.AST, assign: ast.Assign) -> ast.AST | None:
    """The flat window whose index the counter's one assignment adds as is, inside that
    window (``step = epoch * len(loader) + i``, ``i`` the index of a window gated by
    ``% K``): a global count of micro-batches. Not when anything in it divides or takes a
    remainder (``(epoch * len(loader) + i) // K`` counts optimizer steps)."""
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv | ast.Mod | ast.Div)
           for n in walk_all(assign.value)):
        return None
    terms = sum_terms(assign.value)
    for idx, flat in _flat_windows(ctx).items():
        if not any(isinstance(t, ast.Name) and t.id == idx for t in terms):
            continue
        for w in flat:
            if ctx.scope_of(w) is scope and ctx.enclosing(assign, _LOOPS) is w \
                    and not _micro_index(ctx, w.iter):
                facts = ctx.window_facts(w)
                if any(kind == "optimizer" for _, kind in facts.steps) \
                        and not facts.unguarded_optimizer_steps:
                    return w
    return None


def _horizon_over_k(ctx: FileContext, scope: ast.AST, expr: ast.AST, counter: str) -> str | None:
    """An argument of the schedule's call besides the counter that is divided by K (``total
    = epochs * (len(loader) // K)``, as a name of the scope or inline): a horizon counted
    in optimizer steps. Its text, else None."""
    for call in walk_all(expr):
        if not isinstance(call, ast.Call):
            continue
        for a in [*call.args, *(k.value for k in call.keywords)]:
            if any(isinstance(n, ast.Name) and n.id == counter for n in walk_all(a)):
                continue
            values = (_name_values(ctx, scope)[0].get(a.id, []) if isinstance(a, ast.Name)
                      else [a])
            for v in values:
                if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv | ast.Div)
                       and ctx.mentions_accum(n.right) for n in walk_all(v)):
                    return ast.unparse(a)
    return None


def _micro_index(ctx: FileContext, it: ast.AST) -> bool:
    """``range(K)`` or ``enumerate(batch.chunk(K))`` (the index of a micro-batch inside its
    window), not ``range(steps * K)`` nor ``enumerate(micro_batches)``, a pass's stream of
    micro-batches (its name says micro-batch, not K)."""
    if isinstance(it, ast.Call) and (dotted(it.func) or "") == "enumerate" and it.args:
        it = it.args[0]
    if isinstance(it, ast.Name | ast.Attribute):
        return False
    if not (isinstance(it, ast.Call) and (dotted(it.func) or "") == "range"):
        return ctx.mentions_accum(it)
    return any(ctx.mentions_accum(a) and not (isinstance(a, ast.BinOp) and isinstance(a.op, ast.Mult))
               for a in it.args)


def _bounds(ctx: FileContext, window: ast.AST, counter: str) -> tuple[set[str], set[int]]:
    """Names and integers that bound the optimizer steps around ``window``: the enclosing
    loops' ``range(N)``/``while x < N``/``if x >= N: break`` (not the micro counter), and
    ``A`` of a flat window's ``range(A * K)``."""
    exprs: list[ast.AST] = []
    if isinstance(window, ast.For | ast.AsyncFor) and isinstance(window.iter, ast.Call):
        for a in window.iter.args:
            if isinstance(a, ast.BinOp) and isinstance(a.op, ast.Mult):
                exprs += [s for s in (a.left, a.right) if not ctx.mentions_accum(s)]
    cur = ctx.parents.get(window)
    while cur is not None and not isinstance(cur, FUNCS):
        if isinstance(cur, ast.For | ast.AsyncFor) and isinstance(cur.iter, ast.Call) and \
                (dotted(cur.iter.func) or "") == "range":
            exprs += list(cur.iter.args)
        elif isinstance(cur, ast.While):
            exprs.append(cur.test)
        if isinstance(cur, _LOOPS):
            for st in cur.body:
                if isinstance(st, ast.If) and any(isinstance(b, ast.Break) for b in st.body):
                    exprs.append(st.test)
        cur = ctx.parents.get(cur)
    names: set[str] = set()
    ints: set[int] = set()
    for e in exprs:
        for sub in walk_all(e):
            if isinstance(sub, ast.Name) and sub.id != counter and not ctx.mentions_accum(sub):
                names.add(sub.id)
                if (v := _int_of(ctx, sub.id)) is not None and v > 1:
                    ints.add(v)
            elif isinstance(sub, ast.Constant) and type(sub.value) is int and sub.value > 1:
                ints.add(sub.value)
    return names, ints


def _schedule_reads(ctx: FileContext, expr: ast.AST, counter: str) -> set[str] | None:
    """The names the schedule reads besides the counter (a local function's free names, or
    the inline expression's), None when the counter is divided or reaches it otherwise."""
    defs = _single_defs(ctx)
    reads: set[str] = set()
    found = False
    for sub in walk_all(expr):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in defs:
            args = [a for a in sub.args if any(isinstance(n, ast.Name) and n.id == counter for n in walk_all(a))]
            if not args:
                continue
            if any(not isinstance(a, ast.Name) for a in args):
                return None  # get_lr(it // K), get_lr(it + offset): not judged
            fn = defs[sub.func.id]
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
            reads |= {n.id for n in walk_all(fn) if isinstance(n, ast.Name) and n.id not in params}
            found = True
    if not found:
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv | ast.Mod) for n in walk_all(expr)):
            return None
        names = {n.id for n in walk_all(expr) if isinstance(n, ast.Name)}
        if counter not in names:
            return None
        reads = names - {counter}
    return reads


def _lr_sources(ctx: FileContext, write: ast.Assign) -> Iterator[tuple[ast.AST, list[ast.AST], ast.AST]]:
    """(scope, the values the written rate is computed from there, where to report): the
    write's own function; and when the rate reads a parameter of a helper (``def
    set_lr(opt, base, f): g["lr"] = base * f``), each call's argument for it in its caller
    (``f = warmup_factor(it, c)`` then ``set_lr(opt, lr, f)``), reported at the call."""
    scope = ctx.scope_of(write)
    values: list[ast.AST] = [write.value]
    if isinstance(write.value, ast.Name):
        values = _name_values(ctx, scope)[0].get(write.value.id, [])
    yield scope, values, write
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return
    params = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
    read = [p for p in params if any(isinstance(n, ast.Name) and n.id == p for v in values
                                     for n in walk_all(v))]
    for site in ctx.call_sites(scope):
        caller = ctx.scope_of(site)
        args: list[ast.AST] = []
        for p in read:
            arg = bound_argument(scope, site, p)
            if arg is not None:
                args += (_name_values(ctx, caller)[0].get(arg.id, []) if isinstance(arg, ast.Name)
                         else [arg])
        if args:
            yield caller, args, site


@rule("AG130")
def lr_from_micro_counter(ctx: FileContext) -> Iterator[Finding]:
    for write in _lr_writes(ctx):
        for scope, values, at in _lr_sources(ctx, write):
            for value in values:
                counters = {n.id for n in walk_all(value) if isinstance(n, ast.Name)}
                for counter in sorted(counters):
                    window = _micro_window(ctx, scope, counter)
                    if window is None:
                        continue
                    reads = _schedule_reads(ctx, value, counter)
                    if reads is None or any(
                        ctx.mentions_accum(ast.Name(id=r)) or any(ctx.mentions_accum(v) for v in ctx.values_by_name().get(r, []))
                        for r in reads
                    ):
                        continue  # the schedule's constants are built from K: counted in micro-batches
                    names, ints = _bounds(ctx, window, counter)
                    tied = sorted(reads & names) or sorted(
                        r for r in reads if (v := _int_of(ctx, r)) is not None and v in ints
                    )
                    over_k = None if tied else _horizon_over_k(ctx, scope, value, counter)
                    if over_k is not None:
                        tied = [over_k]
                    msg = (
                        f"the learning rate written into the param groups is computed from `{counter}`, "
                        f"which counts micro-batches (it advances on every micro-batch of the window at "
                        f"line {getattr(window, 'lineno', 0)}), so the schedule advances K positions per optimizer step"
                    )
                    if tied:
                        msg += (f", while its horizon (`{tied[0]}`) is "
                                + ("counted in optimizer steps (it is divided by K)" if over_k
                                   else "the loop's number of optimizer steps")
                                + ": warm-up ends K times early and the decay reaches its floor "
                                "after 1/K of the run")
                        yield ctx.finding("AG130", at, msg)
                    else:
                        msg += (": K times ahead, unless the schedule's constants are counted in "
                                "micro-batches (not in sight)")
                        f = ctx.finding("AG130", at, msg)
                        yield replace(f, severity=Severity.WARNING, confidence=Confidence.LOW)
                    break


#: Lightning hooks that run on every batch (micro-batch) under automatic optimisation
#: Lightning methods whose ``batch_idx`` counts micro-batches: the hooks run on every batch,
#: and ``optimizer_step``, run at each window's end, gets the index of the window's last batch
_PER_BATCH_HOOKS = frozenset({"on_train_batch_start", "on_train_batch_end", "training_step",
                              "on_before_backward", "on_after_backward", "optimizer_step"})


#: the Lightning loop's counters of batches (micro-batches under accumulation)
_LOOP_COUNTERS = ("epoch_loop.total_batch_idx", "epoch_loop.batch_idx", "fit_loop.total_batch_idx",
                  "batch_progress.current.completed", "batch_progress.total.completed")


def _lightning_k(ctx: FileContext) -> tuple[int | None, bool]:
    """``accumulate_grad_batches`` as the file gives it: (its value, whether it is given)."""
    values = [k.value for c in ctx.of(ast.Call) for k in c.keywords if k.arg == "accumulate_grad_batches"]
    if not values:
        return None, False
    ints = {ctx.int_value(v) for v in values}
    return (ints.pop() if len(ints) == 1 else None), True


@rule("AG130")
def lr_from_lightning_batch_idx(ctx: FileContext) -> Iterator[Finding]:
    """A learning rate written in a Lightning hook that runs on every batch
    (``on_train_batch_start(self, trainer, pl_module, batch, batch_idx)``), or in an
    ``optimizer_step`` override, from ``batch_idx``,
    with ``accumulate_grad_batches`` > 1: ``batch_idx`` counts micro-batches, so the schedule
    advances K positions per optimizer step (``trainer.global_step`` counts optimizer
    steps). An error when K > 1 is in sight, a warning when its value is not."""
    k, given = _lightning_k(ctx)
    if not given or k == 1:
        return
    for write in _lr_writes(ctx):
        fn = ctx.enclosing(write, FUNCS)
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        values: list[ast.AST] = [write.value]
        if isinstance(write.value, ast.Name):
            values = _name_values(ctx, fn)[0].get(write.value.id, [])
        # through the hook's own names, a few levels (`step = batch_idx`, `scale = f(step)`)
        local = _name_values(ctx, fn)[0]
        reads: set[str] = set()
        todo = list(values)
        for _ in range(4):
            found = {n.id for v in todo for n in walk_all(v) if isinstance(n, ast.Name)} - reads
            reads |= found
            todo = [x for name in found for x in local.get(name, [])]
            if not todo:
                break
        # the trainer's own micro-batch counters, read in any hook (a callback's
        # on_before_optimizer_step runs once per step, but these still count batches)
        loop_counter = next((d for v in [*values, *(x for r in reads for x in local.get(r, []))]
                             for n in walk_all(v) if isinstance(n, ast.Attribute)
                             and (d := dotted(n) or "").endswith(_LOOP_COUNTERS)), None)
        if loop_counter is not None:
            counter = loop_counter.rsplit(".", 1)[-1]
        elif "batch_idx" in reads and fn.name in _PER_BATCH_HOOKS \
                and "batch_idx" in {a.arg for a in fn.args.args}:
            counter = "batch_idx"
        else:
            continue
        f = ctx.finding(
            "AG130",
            write,
            f"the learning rate written in `{fn.name}` is computed from `{counter}`, which counts "
            "micro-batches, while `accumulate_grad_batches`"
            + (f" = {k}" if k is not None else " is set")
            + ": the schedule advances K positions per optimizer step (the large batch steps "
            "it once per optimizer step)",
            fix="compute it from `trainer.global_step` (optimizer steps), or use an LR scheduler "
                "with interval 'step' in configure_optimizers",
        )
        yield f if k is not None else replace(f, severity=Severity.WARNING, confidence=Confidence.LOW)


def _resolved_attr(ctx: FileContext, node: ast.Attribute, scope: ast.AST) -> str:
    """``loop.total_batch_idx`` with ``loop = self.trainer.fit_loop`` assigned once in
    ``scope``: ``self.trainer.fit_loop.total_batch_idx``."""
    text = dotted(node) or ""
    head, _, rest = text.partition(".")
    values = ctx.assigned_in(scope).get(head, []) if rest else []
    if len(values) == 1 and (base := dotted(values[0])) is not None:
        return f"{base}.{rest}"
    return text


@rule("AG130")
def lambda_from_lightning_loop_counter(ctx: FileContext) -> Iterator[Finding]:
    """A ``LambdaLR`` whose function ignores the step it is given and reads one of the
    Lightning loop's batch counters instead (``loop = self.trainer.fit_loop`` then
    ``loop.total_batch_idx``), with ``accumulate_grad_batches`` > 1: the counter advances K
    per optimizer step, the scheduler once, so the schedule runs K times fast."""
    k, given = _lightning_k(ctx)
    if not given or k == 1:
        return
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "LambdaLR":
            continue
        fn = lambda_body(ctx, call)
        if fn is None or not fn.args.args:
            continue
        step = fn.args.args[0].arg
        body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
        if any(isinstance(n, ast.Name) and n.id == step for b in body for n in walk_all(b)):
            continue  # it reads its step
        scope = ctx.enclosing(fn, FUNCS) or ctx.tree
        counter = next((r for b in body for n in walk_all(b) if isinstance(n, ast.Attribute)
                        and (r := _resolved_attr(ctx, n, scope)).endswith(_LOOP_COUNTERS)), None)
        if counter is None:
            continue
        f = ctx.finding(
            "AG130",
            call,
            f"the LambdaLR's function ignores the step it is given and reads `{counter}`, which "
            "counts micro-batches, while `accumulate_grad_batches`"
            + (f" = {k}" if k is not None else " is set")
            + ": Lightning steps the scheduler once per optimizer step, but the rate it computes "
            "advances K positions per step, so the schedule runs K times fast",
            fix="compute the factor from the step LambdaLR passes (it counts the scheduler's "
                "steps), or from `trainer.global_step`",
        )
        yield f if k is not None else replace(f, severity=Severity.WARNING, confidence=Confidence.LOW)


def _micro_batches_of(ctx: FileContext, expr: ast.AST, loader: str) -> bool:
    """``expr`` is a product holding ``len(loader)``: micro-batches per pass times a count of
    passes (``epoch * len(loader)``)."""
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult)):
        return False
    return any(isinstance(side, ast.Call) and isinstance(side.func, ast.Name) and side.func.id == "len"
               and len(side.args) == 1 and dotted(side.args[0]) == loader
               for side in (expr.left, expr.right))


def _fed_to_schedule(ctx: FileContext, fn: ast.AST, counter: str) -> ast.Call | None:
    """A call in ``fn`` that hands ``counter`` to a schedule: ``sched.step_update(num_updates=n)``,
    ``sched.step(n)``, ``get_lr(n)``."""
    for call in (n for n in walk_local(fn) if isinstance(n, ast.Call)):
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        args = [*call.args, *(k.value for k in call.keywords)]
        if any(dotted(a) == counter for a in args) and (
                name in ("step_update", "step") or "lr" in name.lower() or "sched" in name.lower()):
            return call
    return None


@rule("AG130")
def update_counter_started_from_micro_batches(ctx: FileContext) -> Iterator[Finding]:
    """``num_updates = epoch * len(loader)`` before a window loop over ``loader`` that counts
    ``num_updates += 1`` once per optimizer step and hands it to the schedule (timm's
    ``train_one_epoch``, whose own start is ``epoch * updates_per_epoch``): from the second
    pass on the counter starts K times too far, the schedule runs ahead."""
    for window in ctx.windows():
        if not isinstance(window, ast.For) or not ctx.window_facts(window).accumulating:
            continue
        it = window.iter
        while isinstance(it, ast.Call) and dotted(it.func) in ("enumerate", "tqdm") and it.args:
            it = it.args[0]
        loader = dotted(it)
        fn = ctx.enclosing(window, FUNCS) or ctx.tree
        if loader is None:
            continue
        for inc in (n for n in walk_local(window) if isinstance(n, ast.AugAssign)):
            counter = dotted(inc.target)
            if counter is None or not isinstance(inc.op, ast.Add) or not ctx.guarded(inc, window):
                continue
            start = ctx.reaching_write(fn, counter, window)
            if not (isinstance(start, ast.Assign) and _micro_batches_of(ctx, start.value, loader)):
                continue
            fed = _fed_to_schedule(ctx, fn, counter)
            if fed is None:
                continue
            yield replace(ctx.finding(
                "AG130",
                start,
                f"`{ast.unparse(start)}` starts `{counter}`, which counts optimizer steps "
                f"(`{ast.unparse(inc)}` at line {inc.lineno}, once per window) and feeds the "
                f"schedule (`{ast.unparse(fed)}`, line {fed.lineno}), at the number of "
                f"micro-batches of the passes before (`len({loader})` per pass): with K > 1 "
                "each pass after the first starts the schedule K times too far along, so it "
                "runs ahead of the optimizer steps",
                fix=f"start it at the optimizer steps of the passes before: `epoch * "
                    f"updates_per_epoch` with updates_per_epoch = ceil(len({loader}) / K)",
            ), severity=Severity.ERROR, confidence=Confidence.MEDIUM)
            break


_LAMBDA_SCHEDULERS = frozenset({"LambdaLR", "MultiplicativeLR"})


def _schedule_function(ctx: FileContext, call: ast.Call
                       ) -> tuple[ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef, list[str]] | None:
    """The function a ``LambdaLR(opt, fn)`` call is given (a lambda, a def, ``self.method``)
    with its parameters, ``self`` left out; None for a list of functions or one not read."""
    ref = next((k.value for k in call.keywords if k.arg == "lr_lambda"),
               call.args[1] if len(call.args) > 1 else None)
    fn: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | None
    fn = ref if isinstance(ref, ast.Lambda) else ctx.function_named(ref, call)
    if fn is None:
        return None
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if params and params[0] == "self" and not isinstance(fn, ast.Lambda):
        params = params[1:]
    return fn, params


def _steps(ctx: FileContext, node: ast.AST, depth: int = 1) -> bool:
    """``node`` steps an optimizer or engine, directly or through a function of the file it
    calls (``self.optimizer_step()``), ``depth`` levels down."""
    for c in walk_local(node):
        if not isinstance(c, ast.Call):
            continue
        if ctx.is_step(c, ("optimizer", "engine")):
            return True
        callee = ctx.callee_of(c) if depth > 0 else None
        if callee is not None and callee is not node and _steps(ctx, callee, depth - 1):
            return True
    return False


def _per_micro_increment(ctx: FileContext, inc: ast.AugAssign) -> bool:
    """``inc`` (``x += 1``) runs on every micro-batch: unguarded in an accumulating window,
    or in a function that runs a backward and steps nothing, called from a loop that steps
    nothing itself inside a loop that does (``for mb in window: self.training_step(mb)``
    then ``self.optimizer_step()``): several backwards per optimizer step."""
    for window in _accumulating_windows(ctx):
        if ctx.enclosing(inc, _LOOPS) is window:
            return not ctx.guarded(inc, window)
    fn = ctx.enclosing(inc, FUNCS)
    loop = ctx.enclosing(inc, _LOOPS)
    if fn is None or (loop is not None and ctx.scope_of(loop) is fn):
        return False  # (a loop of the function's own: not once per call)
    backward = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                   and c.func.attr in ("backward", "manual_backward") for c in walk_local(fn))
    if not backward or _steps(ctx, fn):
        return False
    sites = ctx.call_sites(fn)
    for site in sites:
        inner = ctx.enclosing(site, _LOOPS)
        outer = ctx.enclosing(inner, _LOOPS) if inner is not None else None
        if inner is None or outer is None or _steps(ctx, inner) or not _steps(ctx, outer):
            return False
    return bool(sites)


@rule("AG130")
def lambda_schedule_reads_micro_counter(ctx: FileContext) -> Iterator[Finding]:
    """A ``LambdaLR`` whose function ignores the step the scheduler hands it and reads a
    counter of the script's instead (``lambda _: warmup(self.state.global_step)``), where that
    counter is incremented on every micro-batch: the factor follows micro-batches, K per
    optimizer step, whatever the scheduler's own count."""
    incs: dict[str, list[ast.AugAssign]] = {}
    for n in ctx.of(ast.AugAssign):
        name = dotted(n.target)
        if name and isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant) and n.value.value == 1:
            incs.setdefault(name, []).append(n)
    if not incs:
        return
    for call in ctx.of(ast.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] not in _LAMBDA_SCHEDULERS:
            continue
        got = _schedule_function(ctx, call)
        if got is None or not got[1]:
            continue
        fn, params = got
        body = fn.body if isinstance(fn, ast.Lambda) else fn
        names = [n for n in walk_all(body) if isinstance(n, ast.Name | ast.Attribute)]
        if any(isinstance(n, ast.Name) and n.id == params[0] for n in names):
            continue  # the function reads its step
        read = {d for d in (dotted(n) for n in names) if d}
        for counter in sorted(read & set(incs)):
            if not all(_per_micro_increment(ctx, i) for i in incs[counter]):
                continue
            inc = incs[counter][0]
            yield ctx.finding(
                "AG130",
                call,
                f"the LambdaLR function ignores the step the scheduler passes it "
                f"(`{params[0]}`) and reads `{counter}`, which `{ast.unparse(inc)}` (line "
                f"{inc.lineno}) advances on every micro-batch: the learning-rate factor moves K "
                "positions per optimizer step, so warm-up ends K times early and the decay "
                "reaches its floor after 1/K of the run",
                fix=f"compute the factor from the step argument (`{params[0]}`), which counts "
                    "scheduler steps, or from a counter incremented once per optimizer step",
            )
            break
