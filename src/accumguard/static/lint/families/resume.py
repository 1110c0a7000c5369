"""A checkpoint taken inside a window and resumed as is (F13): AG150.

A training-state checkpoint (``torch.save`` of a dict holding the optimizer's
``state_dict()``) keeps the weights, the optimizer and the micro-batch counter, never the
gradient the current window has accumulated so far. Saved every N micro-batches with N
not a multiple of K, some checkpoints fall inside a window; a resume that restores the
counter as saved (``self.micro_step = ck["micro_step"]``) then continues the window
without its first micro-batches, and the optimizer steps on the rest of it (a short
window, still divided by K). Reported when all of it is in the file: the save, its
``counter % N`` trigger on a counter the boundary test ``counter % K`` also reads, both N
and K as integers, and the restore of that counter from the checkpoint's entry. A
warning: only a run that resumes from such a checkpoint is off. A restore rounded down to
the window's start (``ck["step"] - ck["step"] % K``), a trigger that also tests ``% K``,
or a checkpoint holding gradients is right and not reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, last_part, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._modguard import enumerate_start


def _identifiers(expr: ast.AST) -> set[str]:
    return {last_part(d) for n in ast.walk(expr) if (d := dotted(n)) is not None} - {"self"}


def _k_moduli(ctx: FileContext) -> tuple[set[str], set[int]]:
    """The counters the file tests against K (``micro_step % accum``) and the values of K."""
    counters: set[str] = set()
    ks: set[int] = set()
    for n in ctx.of(ast.BinOp):
        if isinstance(n.op, ast.Mod) and ctx.mentions_accum(n.right):
            counters |= _identifiers(n.left)
            ks |= {v for v in ctx.int_candidates(n.right) if v is not None}
            if (v := _bound_int(ctx, n.right)) is not None:
                ks.add(v)
    return counters, ks


def _payload(ctx: FileContext, call: ast.Call) -> ast.Dict | None:
    """The dict ``torch.save`` writes: a literal, or a name assigned one literal in the function."""
    first: ast.AST | None = call.args[0] if call.args else None
    if isinstance(first, ast.Name):
        scope = ctx.scope_of(call)
        values = ctx.assigned_in(scope).get(first.id, [])
        first = values[0] if len(values) == 1 else None
    return first if isinstance(first, ast.Dict) else None


def _training_state(ctx: FileContext, d: ast.Dict) -> bool:
    """The dict holds an optimizer's ``state_dict()`` and no gradient."""
    text = ast.unparse(d)
    if ".grad" in text or "'grad" in text or '"grad' in text:
        return False
    for key, value in zip(d.keys, d.values, strict=True):
        if isinstance(value, ast.ListComp | ast.List | ast.Tuple):
            # several optimizers: `[o.state_dict() for o in self.opts]`
            inner = value.elt if isinstance(value, ast.ListComp) else (
                value.elts[0] if value.elts else None)
            value = inner if inner is not None else value
        if isinstance(value, ast.Call) and call_attr(value) == "state_dict":
            named = isinstance(key, ast.Constant) and "opt" in str(key.value).lower()
            if named or ctx.kind_of_receiver(receiver(value)) == "optimizer":
                return True
    return False


def _bound_int(ctx: FileContext, expr: ast.AST) -> int | None:
    """The integer ``expr`` holds, also through a constructor: ``self.every`` assigned from
    ``__init__``'s parameter, the class built once with an integer for it."""
    v = ctx.int_through_names(expr)
    if v is not None or not (isinstance(expr, ast.Attribute) and dotted(expr.value) == "self"):
        return v
    cls = ctx.enclosing(expr, (ast.ClassDef,))
    init = next((f for f in getattr(cls, "body", []) if isinstance(f, FUNCS) and f.name == "__init__"), None)
    if not isinstance(cls, ast.ClassDef) or init is None:
        return None
    sources = [n.value for n in ast.walk(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
               and dotted(n.targets[0]) == f"self.{expr.attr}"]
    if len(sources) != 1 or not isinstance(sources[0], ast.Name):
        return None
    params = [a.arg for a in init.args.args[1:]]
    if sources[0].id not in params:
        return None
    pos = params.index(sources[0].id)
    values: set[int | None] = set()
    for call in ctx.of(ast.Call):
        if isinstance(call.func, ast.Name) and call.func.id == cls.name:
            kw = next((k.value for k in call.keywords if k.arg == sources[0].id), None)
            arg = kw if kw is not None else (call.args[pos] if pos < len(call.args) else None)
            values.add(ctx.int_value(arg) if arg is not None else None)
    return next(iter(values)) if len(values) == 1 and None not in values else None


def _triggers(ctx: FileContext, save: ast.Call) -> Iterator[tuple[ast.If, ast.BinOp]]:
    """The ``if ... % N`` tests that decide the save: around it, or around the calls of the
    (once-defined) function that holds it."""
    sites: list[ast.AST] = [save]
    seen: set[int] = set()
    depth = {id(save): 0}
    while sites:
        site = sites.pop(0)
        node: ast.AST | None = site
        while node is not None and not isinstance(node, FUNCS):
            parent = ctx.parents.get(node)
            if isinstance(parent, ast.If) and node in parent.body:
                test: ast.AST = parent.test
                fn = ctx.enclosing(parent, FUNCS)
                if isinstance(test, ast.Name) and fn is not None:
                    # `boundary = (self.micro_step + 1) % K == 0` ... `if boundary:`
                    values = ctx.assigned_in(fn).get(test.id, [])
                    test = values[0] if len(values) == 1 else test
                for m in ast.walk(test):
                    if isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod):
                        yield parent, m
            node = parent
        # the function holding it, through the calls of it (a method called from the
        # step helper, itself called at the boundary), a few levels up
        fn = ctx.enclosing(site, FUNCS)
        if not isinstance(fn, FUNCS) or id(fn) in seen or depth[id(site)] >= 3 \
                or len(ctx.defs_by_name().get(fn.name, [])) != 1:
            continue
        seen.add(id(fn))
        for c in ctx.of(ast.Call):
            if (isinstance(c.func, ast.Attribute) and c.func.attr == fn.name) \
                    or (isinstance(c.func, ast.Name) and c.func.id == fn.name):
                depth[id(c)] = depth[id(site)] + 1
                sites.append(c)


def _restores(ctx: FileContext, keys: dict[str, set[str]]) -> list[ast.Assign | ast.Call]:
    """``self.micro_step = ck["micro_step"]``: a counter set from the checkpoint's own entry,
    as saved (no arithmetic around it); or a call of a function of the file passing that entry
    as the parameter its loop's ``enumerate`` starts from (``train(..., st["micro"])``)."""
    # `start = ck["micro_step"]` then `for micro_step in range(start, total)`: the counter
    # restored through its loop's start
    starts: dict[str, str] = {}
    for loop in ctx.of(ast.For):
        it = loop.iter
        if isinstance(it, ast.Call) and dotted(it.func) == "range" and len(it.args) >= 2 \
                and isinstance(it.args[0], ast.Name) and isinstance(loop.target, ast.Name):
            starts[it.args[0].id] = loop.target.id
        # `for micro_step, batch in enumerate(itr, start=self.start_micro)`
        index, start = _enumerate_index(loop), _enumerate_start(loop)
        if index is not None and start is not None:
            starts[start] = index
        # `if batch_idx < start_batch: continue`: where a resumed loop's skipping ends
        if index is not None and (skip := _skip_threshold(loop)) is not None:
            starts[skip] = index
    out: list[ast.Assign | ast.Call] = []
    for call in ctx.of(ast.Call):
        defs = ctx.defs_by_name().get(call.func.id, []) if isinstance(call.func, ast.Name) else []
        if len(defs) != 1:
            continue
        for loop in (n for n in ast.walk(defs[0]) if isinstance(n, ast.For)):
            index, start = _enumerate_index(loop), _enumerate_start(loop)
            arg = bound_argument(defs[0], call, start) if index and start else None
            if isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Constant) \
                    and arg.slice.value in keys and index in keys[arg.slice.value]:
                out.append(call)
                break
    for n in ctx.of(ast.Assign):
        if len(n.targets) != 1:
            continue
        pairs = [(n.targets[0], n.value)]
        if isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Tuple) \
                and len(n.targets[0].elts) == len(n.value.elts):
            pairs = list(zip(n.targets[0].elts, n.value.elts, strict=True))  # a, b = ck["a"], ck["b"]
        if any(isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Constant)
               and isinstance(v.slice.value, str) and v.slice.value in keys
               and (d := dotted(t)) is not None
               and (last_part(d) in keys[v.slice.value] or starts.get(d) in keys[v.slice.value])
               for t, v in pairs):
            out.append(n)
    return out


def _enumerate_index(loop: ast.For) -> str | None:
    """The index name of ``for i, x in enumerate(...)``."""
    it, target = loop.iter, loop.target
    if isinstance(it, ast.Call) and dotted(it.func) == "enumerate" and isinstance(target, ast.Tuple) \
            and target.elts and isinstance(target.elts[0], ast.Name):
        return target.elts[0].id
    return None


def _enumerate_start(loop: ast.For) -> str | None:
    """The name given as ``start=`` to the loop's ``enumerate``."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and dotted(it.func) == "enumerate"):
        return None
    start = enumerate_start(it)
    return dotted(start) if start is not None else None


def _loop_index_saved(ctx: FileContext, test: ast.If, save: ast.Call,
                      names: set[str]) -> ast.For | None:
    """The boundary ``test`` sits in ``for i, x in enumerate(...)`` whose index ``i`` (the
    position of the current micro-batch, one less than the micro-batches consumed) is what the
    checkpoint stores: as the payload's own value, or as the argument the call of the helper
    holding ``torch.save`` passes inside ``test`` (``self.save_checkpoint(micro_step)``)."""
    loop = ctx.enclosing(test, (ast.For,))
    if not isinstance(loop, ast.For):
        return None
    index = _enumerate_index(loop)
    if index is None or index not in names:
        return None
    fn = ctx.enclosing(save, FUNCS)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or ctx.enclosing(test, FUNCS) is fn:
        return loop  # (saved in the loop's own function: the payload names the index)
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args)}
    for c in ast.walk(test):
        if isinstance(c, ast.Call) and call_attr(c) == fn.name:
            for p in params & names:
                arg = bound_argument(fn, c, p)
                if isinstance(arg, ast.Name) and arg.id == index:
                    return loop
    return None


def _skip_threshold(loop: ast.For) -> str | None:
    """The name ``S`` of ``if i < S: continue`` at the top of the loop over ``enumerate``
    (``i`` its index): the micro-batches a resumed loop skips."""
    index = _enumerate_index(loop)
    for stmt in loop.body[:3]:
        if isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[0], ast.Continue) \
                and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1 \
                and isinstance(stmt.test.ops[0], ast.Lt) and dotted(stmt.test.left) == index:
            return dotted(stmt.test.comparators[0])
    return None


def _increment_after(ctx: FileContext, test: ast.If, names: set[str]) -> ast.AugAssign | None:
    """``counter += 1`` later in the loop iteration that runs ``test``: a statement after the
    ``if`` (or after a block holding it) up to the innermost loop around it."""
    child: ast.AST = test
    cur = ctx.parents.get(test)
    while cur is not None:
        for field in ("body", "orelse"):
            block = getattr(cur, field, None)
            if isinstance(block, list) and child in block:
                for stmt in block[block.index(child) + 1:]:
                    for n in ast.walk(stmt):
                        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) \
                                and (d := dotted(n.target)) is not None and last_part(d) in names:
                            return n
        if isinstance(cur, (ast.For, ast.While, *FUNCS)):
            return None  # (a method run once per micro-batch: its own body's end)
        child, cur = cur, ctx.parents.get(cur)
    return None


def _saved_before_increment(ctx: FileContext, at_boundary: list[tuple[ast.If, ast.BinOp]],
                            keys: dict[str, set[str]], restores: list[ast.Assign | ast.Call],
                            save: ast.Call) -> Iterator[Finding]:
    """A checkpoint at the boundary ``(step + 1) % K == 0`` that stores ``step`` before the
    loop's ``step += 1``: resumed as saved, the first test is true again, and the optimizer
    steps after one micro-batch; every later window is shifted (fairseq-style trainers)."""
    saved: set[str] = set().union(*keys.values())
    for test, mod in at_boundary:
        names = _identifiers(mod.left) & saved
        inc = _increment_after(ctx, test, names) if names else None
        loop = _loop_index_saved(ctx, test, save, names) if names and inc is None else None
        if loop is not None:
            # the index is resumed only if the restored value starts the loop again
            # (`enumerate(stream, start=self.resume_from)`), or is where its skipping ends
            # (`if batch_idx < start_batch: continue`)
            starts = {n for n in (_enumerate_start(loop), _skip_threshold(loop)) if n}
            fed = [r for r in restores if starts and (
                isinstance(r, ast.Call) or any(dotted(t) in starts for t in ast.walk(r.targets[0])))]
            restores, loop = (fed, loop) if fed else (restores, None)
        if inc is None and loop is None:
            continue
        restore = restores[0]
        before = (f"before `{ast.unparse(inc)}` (line {inc.lineno})" if inc is not None else
                  f"with the index of `{ast.unparse(loop.iter)}` (line {loop.lineno}), the "
                  "position of the last micro-batch, not the number consumed"
                  if loop is not None else "")
        skip = _skip_threshold(loop) if loop is not None else None
        if skip is not None and isinstance(restore, ast.Assign) and any(
                dotted(t) == skip for t in ast.walk(restore.targets[0])):
            yield ctx.finding(
                "AG150",
                restore,
                f"the checkpoint is written when `{ast.unparse(test.test)}` is true, {before}; "
                f"restored as saved (`{ast.unparse(restore)}`), the resumed loop skips only the "
                f"micro-batches before it (`{skip}`), so it runs the window's last micro-batch "
                "again, and the same test is true there: the optimizer steps on a window of "
                "that one micro-batch, seen twice. Resume after it (`+ 1`)",
            )
            return
        yield ctx.finding(
            "AG150",
            restore,
            f"the checkpoint is written when `{ast.unparse(test.test)}` is true, {before}, "
            f"so it stores the counter one short of the window's end; restored as saved (`{ast.unparse(restore)}`), the same test is "
            "true after the first resumed micro-batch: the optimizer steps on a window of one "
            "micro-batch and every later window is shifted. Save the counter after its "
            "increment (or `counter + 1`)",
        )
        return


def _saved_in(ctx: FileContext, save: ast.Call, loop: ast.AST) -> bool:
    """``torch.save`` runs inside ``loop``: there, or in a function of the file called there."""
    if any(n is loop for n in _ancestors(ctx, save)):
        return True
    fn = ctx.enclosing(save, FUNCS)
    return isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and any(
        isinstance(c, ast.Call) and call_attr(c) == fn.name for c in ast.walk(loop))


def _ancestors(ctx: FileContext, node: ast.AST) -> Iterator[ast.AST]:
    cur = ctx.parents.get(node)
    while cur is not None:
        yield cur
        cur = ctx.parents.get(cur)


def _exit_before_increment(ctx: FileContext, keys: dict[str, set[str]],
                           restores: list[ast.Assign | ast.Call], save: ast.Call) -> Finding | None:
    """The step's branch ``if (c + 1) % K == 0:`` leaves the loop (``return``/``break``,
    a preemption or ``max_steps``) before the loop's own ``c += 1`` after it: the counter
    stops one short of the micro-batches consumed. Saved and restored as it stands, the
    resumed run's first window closes after one micro-batch and every later one is shifted.
    Only for a checkpoint written after the loop is left (a preemption's save)."""
    saved: set[str] = set().union(*keys.values()) if keys else set()
    if not saved or not restores:
        return None
    for m in ctx.of(ast.BinOp):
        if isinstance(m.op, ast.Mod) and ctx.mentions_accum(m.right):
            test = ctx.enclosing(m, (ast.If,))
            if not (isinstance(test, ast.If) and any(n is m for n in ast.walk(test.test))):
                continue
            names = _identifiers(m.left) & saved
            inc = _increment_after(ctx, test, names) if names else None
            if inc is None:
                continue
            body = [n for stmt in test.body for n in ast.walk(stmt)]
            if any(isinstance(n, ast.AugAssign | ast.Assign) and any(
                    (d := dotted(t)) is not None and last_part(d) in names
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])) for n in body):
                continue  # counted in the branch too
            loop = ctx.enclosing(test, (ast.For, ast.While))
            fn = ctx.enclosing(test, FUNCS)
            exits = [n for n in body if (isinstance(n, ast.Return) and ctx.enclosing(n, FUNCS) is fn)
                     or (isinstance(n, ast.Break) and ctx.enclosing(n, (ast.For, ast.While)) is loop)]
            if not exits or loop is None or ctx.enclosing(inc, (ast.For, ast.While)) is not loop:
                continue
            if _saved_in(ctx, save, loop):
                continue  # saved in the loop (at the boundary: judged there), not after leaving it
            restore, leave = restores[0], exits[0]
            return ctx.finding(
                "AG150",
                leave,
                f"`{ast.unparse(leave)}` (line {leave.lineno}) leaves the loop from the step's "
                f"branch (`{ast.unparse(test.test)}`) before `{ast.unparse(inc)}` (line "
                f"{inc.lineno}): the counter stops one short of the micro-batches consumed; the "
                f"checkpoint stores it and the resume restores it as saved (`{ast.unparse(restore)}`, "
                f"line {restore.lineno}), so the resumed run's first window closes after one "
                "micro-batch and every later window is shifted",
                fix=f"count before the boundary test (`{ast.unparse(inc)}` first, then test "
                    "`counter % K == 0`), or count before leaving",
            )
    return None


@rule("AG150")
def checkpoint_inside_window(ctx: FileContext) -> Iterator[Finding]:
    saves = [c for c in ctx.of(ast.Call) if dotted(c.func) == "torch.save"]
    if not saves:
        return
    counters, ks = _k_moduli(ctx)
    if not counters:
        yield from _accelerate_checkpoint_inside_window(ctx, saves)
    if len(ks) > 1 or not counters:
        return
    k = next(iter(ks), None)  # (a checkpoint at the boundary needs no value of K)
    for save in saves:
        d = _payload(ctx, save)
        if d is None or not _training_state(ctx, d):
            continue
        keys = {key.value: _identifiers(value) & counters for key, value in zip(d.keys, d.values, strict=True)
                if isinstance(key, ast.Constant) and isinstance(key.value, str)}
        restores = _restores(ctx, {key: names for key, names in keys.items() if names})
        if not restores:
            continue
        tests = list(_triggers(ctx, save))
        at_boundary = [(t, m) for t, m in tests if ctx.mentions_accum(m.right)]
        plain = {key.value: keys[key.value] for key, value in zip(d.keys, d.values, strict=True)
                 if isinstance(key, ast.Constant) and isinstance(key.value, str)
                 and dotted(value) is not None}  # stored as it stands, not `step + 1`
        if at_boundary:
            # saved only at a window's boundary: right unless the counter the boundary tests
            # is saved before the loop's increment of it
            yield from _saved_before_increment(ctx, at_boundary, plain, restores, save)
            continue
        early = _exit_before_increment(ctx, plain, restores, save)
        if early is not None:
            yield early
            continue
        for test, mod in tests:
            n = _bound_int(ctx, mod.right)
            if n is None or k is None or n % k == 0 or not (_identifiers(mod.left) & counters):
                continue
            restore = restores[0]
            yield ctx.finding(
                "AG150",
                test,
                f"a checkpoint every {n} micro-batches (`{ast.unparse(test.test)}`) while the "
                f"optimizer steps every {k}: a checkpoint inside a window keeps the weights and "
                "the optimizer but not the gradient accumulated since the window began, and the "
                f"resume restores the counter as saved (`{ast.unparse(restore)}`, line "
                f"{restore.lineno}), so the resumed window steps without its first micro-batches",
            )
            break


def _window_counters(ctx: FileContext) -> dict[str, ast.AugAssign]:
    """Counters of optimizer steps: ``step += 1`` inside an ``if`` whose test is a modulo by
    K (``if (micro + 1) % K == 0: ...; step += 1``), by dotted name."""
    out: dict[str, ast.AugAssign] = {}
    for n in ctx.of(ast.AugAssign):
        if not (isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant) and n.value.value == 1):
            continue
        d = dotted(n.target)
        test = ctx.enclosing(n, (ast.If,))
        if d is not None and isinstance(test, ast.If) and any(
                isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) and ctx.mentions_accum(m.right)
                for m in ast.walk(test.test)):
            out[d] = n
    return out


@rule("AG150")
def micro_counter_restored_from_steps(ctx: FileContext) -> Iterator[Finding]:
    """``self.micro_step = self.global_step`` outside the training loop (a resume): the
    micro-batch counter the boundary test reads ``% K`` set from the count of optimizer steps,
    with no factor K: the resumed run's windows are shifted."""
    counters, _ = _k_moduli(ctx)
    steps = _window_counters(ctx)
    if not counters or not steps:
        return
    for n in ctx.of(ast.Assign):
        if len(n.targets) != 1 or ctx.enclosing(n, (ast.For, ast.While)) is not None:
            continue
        target, value = dotted(n.targets[0]), dotted(n.value)
        if target is None or value is None or last_part(target) not in counters \
                or value not in steps or last_part(value) in counters:
            continue
        inc = steps[value]
        yield ctx.finding(
            "AG150",
            n,
            f"`{ast.unparse(n)}` sets the micro-batch counter, which the boundary test reads "
            f"modulo K, from `{value}`, which counts optimizer steps (`{ast.unparse(inc)}` at "
            f"line {inc.lineno}, once per window): a resumed run starts its counter at S instead "
            "of S x K, so its windows no longer line up with the data it skips; set it to "
            f"`{value} * K`",
        )
        return
    for loop in ctx.of(ast.For):
        # `for it, b in enumerate(batches, start=global_step)`: the loop's index is the
        # micro-batch counter, started from the count of optimizer steps
        index, start = _enumerate_index(loop), _enumerate_start(loop)
        if index is None or start is None or index not in counters or start not in steps \
                or last_part(start) in counters:
            continue
        inc = steps[start]
        yield ctx.finding(
            "AG150",
            loop.iter,
            f"`{ast.unparse(loop.iter)}` starts the micro-batch index `{index}`, which the "
            f"boundary test reads modulo K, at `{start}`, which counts optimizer steps "
            f"(`{ast.unparse(inc)}` at line {inc.lineno}, once per window): a resumed run "
            "starts its index at S instead of S x K, so its first window closes early and "
            f"every later one is shifted; start it at `{start} * K`",
        )
        return


def _accelerate_k(ctx: FileContext) -> int | None:
    """K of the file's ``Accelerator(gradient_accumulation_steps=K)`` (one integer for all),
    when its loop steps inside ``accelerator.accumulate(...)``."""
    if not any(call_attr(c) == "accumulate" for c in ctx.of(ast.Call)):
        return None
    ks = {ctx.int_value(k.value) for c in ctx.of(ast.Call)
          if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Accelerator"
          for k in c.keywords if k.arg == "gradient_accumulation_steps"}
    return ks.pop() if len(ks) == 1 else None


def _accelerate_checkpoint_inside_window(ctx: FileContext, saves: list[ast.Call]) -> Iterator[Finding]:
    """AG150's Accelerate shape: Accelerate counts the window itself (``accumulate()``), and
    a fresh Accelerator counts from 0, so a training state saved every N batches with N not a
    multiple of K and resumed with its batch counter starts a new window at the resume point:
    the saved window's partial gradient is gone and every later window is shifted."""
    k = _accelerate_k(ctx)
    if k is None or k < 2 or any(call_attr(c) == "load_state" for c in ctx.of(ast.Call)):
        return
    for save in saves:
        d = _payload(ctx, save)
        if d is None or not _training_state(ctx, d):
            continue
        keys = {key.value: _identifiers(value) for key, value in zip(d.keys, d.values, strict=True)
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and dotted(value) is not None}
        restores = _restores(ctx, {key: names for key, names in keys.items() if names})
        saved: set[str] = set().union(*keys.values()) if keys else set()
        if not restores:
            continue
        for test, mod in _triggers(ctx, save):
            n = _bound_int(ctx, mod.right)
            if n is None or n % k == 0 or not (_identifiers(mod.left) & saved):
                continue
            restore = restores[0]
            yield ctx.finding(
                "AG150",
                test,
                f"a checkpoint every {n} batches (`{ast.unparse(test.test)}`) while Accelerate "
                f"steps every {k} (`accumulate()`): a checkpoint inside a window keeps the weights "
                "and the optimizer but not the gradient accumulated since the window began, and "
                f"the resume restores the counter (`{ast.unparse(restore)}`, line {restore.lineno}) "
                "into an Accelerator that counts its windows from 0 again: the saved window's "
                "first batches are lost and every later window is shifted",
            )
            return
