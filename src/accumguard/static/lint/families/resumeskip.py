"""A resume that restores the saved iteration counter + 1 when the save stored the
iteration still to run (F13): AG318. And its mirror, AG327: a resume that starts a loop at
the saved index of the micro-batch the loop had just trained.

A loop that checkpoints its counter (``"iter_num": iter_num``) saves either the iteration
it is about to run (nanoGPT's save at the top of the iteration, before its update) or the
one it has just run (a save after the optimizer step, before the counter moves). Only the
second resumes with ``iter_num = ckpt["iter_num"] + 1``; after the first, the + 1 skips a
whole iteration: its window of micro-batches is never trained on, and every schedule read
from the counter is one step ahead for the rest of the run. Reported when all of it is in
the file: the restore ``X = ckpt["key"] + 1``, one dict saving ``"key": X``, one ``X += 1``
in the training loop, and where the save runs in that loop (directly or through a method
it calls) relative to the optimizer step and the increment: the + 1 is right only when the
save comes after the step and before the increment.

AG327: ``for i in range(start, n)`` saving ``{"consumed": i}`` after that iteration's backward,
and a resume passing the saved value back as the loop's start (``start=state["consumed"]``):
micro-batch ``i`` is trained again and every later window shifts by one. Right is saving
``i + 1`` (or restoring ``state[key] + 1``).

AG331: Accelerate's ``skip_first_batches(loader, n)`` given a count of optimizer steps (its
arithmetic divides by K, ``steps_per_epoch = len(loader) // K``, and never multiplies back)
where the loader yields micro-batches: the resume replays micro-batches already trained
and its windows no longer line up with the data. Right is the steps done times K.

AG332: the counter of micro-steps whose ``(X + 1) % K`` decides the window's boundary is set
from a count of optimizer steps (a scheduler's ``last_epoch``, a ``global_step``, a property
of the file returning one, a checkpoint's ``"global_step"``) without multiplying by K: the
resume restarts K times too early in the data and its windows no longer line up.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_boundary import bound_argument
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import expand

__all__ = ["micro_counter_restored_from_step_count", "resume_repeats_the_saved_micro_batch",
           "resume_skips_optimizer_steps_as_batches", "resume_skips_the_saved_iteration"]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _restored_key(value: ast.AST) -> str | None:
    """``ckpt["key"] + 1`` (also ``int(ckpt["key"]) + 1`` and ``ckpt.get("key") + 1``): key."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)
            and isinstance(value.right, ast.Constant) and value.right.value == 1):
        return None
    left = value.left
    if isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "int" \
            and len(left.args) == 1:
        left = left.args[0]
    if isinstance(left, ast.Subscript) and isinstance(left.slice, ast.Constant):
        key = left.slice.value
    elif isinstance(left, ast.Call) and call_attr(left) == "get" and left.args \
            and isinstance(left.args[0], ast.Constant):
        key = left.args[0].value
    else:
        return None
    return key if isinstance(key, str) else None


def _saved_as(ctx: FileContext, key: str, counter: str) -> list[ast.Dict]:
    return [d for d in ctx.of(ast.Dict)
            if any(isinstance(k, ast.Constant) and k.value == key and v is not None
                   and last_part(dotted(v)) == counter for k, v in zip(d.keys, d.values, strict=True))]


def _site_line(ctx: FileContext, loop: ast.AST, node: ast.AST, depth: int = 2) -> int | None:
    """The line in ``loop`` at which ``node`` runs: its own when inside, else the first call
    in the loop of the function holding it (followed ``depth`` calls up)."""
    if _inside(ctx, node, loop):
        return int(getattr(node, "lineno", 0))
    fn = ctx.enclosing(node, FUNCS)
    if fn is None or depth == 0:
        return None
    name = getattr(fn, "name", "")
    lines = [c.lineno for c in walk_all(loop) if isinstance(c, ast.Call)
             and (call_attr(c) == name or (isinstance(c.func, ast.Name) and c.func.id == name))]
    if lines:
        return min(lines)
    calls = [c for c in ctx.of(ast.Call)
             if call_attr(c) == name or (isinstance(c.func, ast.Name) and c.func.id == name)]
    found = [ln for c in calls if (ln := _site_line(ctx, loop, c, depth - 1)) is not None]
    return min(found) if found else None


def _inside(ctx: FileContext, node: ast.AST, loop: ast.AST) -> bool:
    cur = ctx.parents.get(node)
    while cur is not None:
        if cur is loop:
            return True
        cur = ctx.parents.get(cur)
    return False


def _step_line(ctx: FileContext, loop: ast.AST) -> int | None:
    steps = [c for c in ctx.of(ast.Call) if ctx.is_step(c, ("optimizer", "engine"))]
    lines = [ln for c in steps if (ln := _site_line(ctx, loop, c)) is not None]
    return min(lines) if lines else None


def _between(a: int, x: int, b: int) -> bool:
    """``x`` comes after ``a`` and before ``b`` going round the loop body from ``a``."""
    return a < x < b if a < b else (x > a or x < b)


@rule("AG318")
def resume_skips_the_saved_iteration(ctx: FileContext) -> Iterator[Finding]:
    for restore in ctx.of(ast.Assign):
        if len(restore.targets) != 1 or (key := _restored_key(restore.value)) is None:
            continue
        counter = last_part(dotted(restore.targets[0]))
        if not counter:
            continue
        saves = _saved_as(ctx, key, counter)
        incs = [n for n in ctx.of(ast.AugAssign) if isinstance(n.op, ast.Add)
                and isinstance(n.value, ast.Constant) and n.value.value == 1
                and last_part(dotted(n.target)) == counter and ctx.enclosing(n, _LOOPS) is not None]
        if len(saves) != 1 or len(incs) != 1:
            continue
        loop = ctx.enclosing(incs[0], _LOOPS)
        assert loop is not None
        while (outer := ctx.enclosing(loop, _LOOPS)) is not None and \
                ctx.scope_of(outer) is ctx.scope_of(loop) and _step_line(ctx, loop) is None:
            loop = outer
        save_at = _site_line(ctx, loop, saves[0])
        step_at = _step_line(ctx, loop)
        if save_at is None or step_at is None or save_at == step_at:
            continue
        if _between(step_at, save_at, incs[0].lineno):
            continue  # the save holds the iteration just run: + 1 is the next one
        when = ("before the optimizer step of the iteration it numbers"
                if _between(incs[0].lineno, save_at, step_at) or save_at < step_at
                else "after the counter moved on")
        yield ctx.finding(
            "AG318", restore,
            f"the resume sets `{ast.unparse(restore.targets[0])}` to the saved `{key}` + 1, but "
            f"the checkpoint saves `{counter}` (line {saves[0].lineno}) at line {save_at} of "
            f"the loop, {when} (step at line {step_at}, `{counter} += 1` at line "
            f"{incs[0].lineno}): the saved value is the iteration still to run, so the resumed "
            "run skips one whole window and every schedule read from the counter runs one "
            "step ahead")


def _range_start(loop: ast.AST) -> ast.AST | None:
    it = getattr(loop, "iter", None)
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" \
            and len(it.args) >= 2:
        return it.args[0]
    return None


def _restores_as_start(ctx: FileContext, key: str, fn: ast.AST, start: str) -> ast.Subscript | None:
    """A ``state[key]`` (no + 1) passed for the parameter ``start`` of ``fn`` at a call."""
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if start not in params:
        return None
    idx = params.index(start)
    for call in ctx.of(ast.Call):
        if not (isinstance(call.func, ast.Name) and call.func.id == fn.name):
            continue
        arg = next((k.value for k in call.keywords if k.arg == start),
                   call.args[idx] if idx < len(call.args) else None)
        if isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Constant) \
                and arg.slice.value == key:
            return arg
    return None


@rule("AG327")
def resume_repeats_the_saved_micro_batch(ctx: FileContext) -> Iterator[Finding]:
    for d in ctx.of(ast.Dict):
        for k, v in zip(d.keys, d.values, strict=True):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Name)):
                continue
            loop = ctx.enclosing(d, _LOOPS)
            if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name) \
                    or loop.target.id != v.id or not isinstance(start := _range_start(loop), ast.Name):
                continue
            backs = [c for c in walk_all(loop) if isinstance(c, ast.Call) and call_attr(c) == "backward"
                     and c.lineno < d.lineno]
            if not backs:
                continue  # saved before the iteration trained: the index is the next to run
            fn = ctx.enclosing(loop, FUNCS)
            restore = _restores_as_start(ctx, k.value, fn, start.id) if fn is not None else None
            if restore is None:
                continue
            yield ctx.finding(
                "AG327", restore,
                f"the resume starts the loop at line {loop.lineno} at `{ast.unparse(restore)}`, "
                f"but the checkpoint saves `{v.id}` under {k.value!r} (line {d.lineno}) after "
                f"that iteration's backward (line {backs[0].lineno}): the saved value is the "
                "micro-batch just trained, so the resumed run trains it again and every later "
                "window shifts by one")
            return


def _skip_values(ctx: FileContext, arg: ast.AST) -> list[ast.AST]:
    """``arg``, or when it is a parameter of its function, what the calls of that function
    pass for it (constants left out: a first run's ``skip=0``)."""
    fn = ctx.enclosing(arg, FUNCS)
    if not (isinstance(arg, ast.Name) and isinstance(fn, FUNCS)
            and arg.id in {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}):
        return [arg]
    out = [v for c in ctx.call_sites(fn) if (v := bound_argument(fn, c, arg.id)) is not None
           and not isinstance(v, ast.Constant)]
    return out or [arg]


def _in_optimizer_steps(ctx: FileContext, parts: list[ast.AST]) -> ast.AST | None:
    """The division by K that makes the count one of optimizer steps, when the count is
    never multiplied by K back (``steps_per_epoch = len(loader) // K``, then ``completed -
    epoch * steps_per_epoch``)."""
    over_k = next((n.right for p in parts for n in walk_all(p) if isinstance(n, ast.BinOp)
                   and isinstance(n.op, ast.Div | ast.FloorDiv) and ctx.mentions_accum(n.right)),
                  None)
    times_k = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                  and (ctx.mentions_accum(n.left) or ctx.mentions_accum(n.right))
                  for p in parts for n in walk_all(p))
    return None if times_k else over_k


@rule("AG331")
def resume_skips_optimizer_steps_as_batches(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if call_attr(call) != "skip_first_batches" or len(call.args) < 2 and not any(
                k.arg == "num_batches" for k in call.keywords):
            continue
        arg = call.args[1] if len(call.args) > 1 else next(
            k.value for k in call.keywords if k.arg == "num_batches")
        for value in _skip_values(ctx, arg):
            parts = expand(ctx, value)
            over_k = _in_optimizer_steps(ctx, parts)
            if over_k is None:
                continue
            yield ctx.finding(
                "AG331",
                call,
                f"`{ast.unparse(call.func)}` skips `{ast.unparse(value)}` batches, a count of "
                f"optimizer steps (its arithmetic divides by `{ast.unparse(over_k)}` and never "
                "multiplies back): each optimizer step used K micro-batches, so the resume "
                "replays the window's micro-batches already trained and its windows no longer "
                "line up with the data",
            )
            break


#: names of counts of optimizer steps (a scheduler's ``last_epoch``, a trainer's
#: ``global_step``), as opposed to counts of micro-batches
_STEP_COUNTS = frozenset({"global_step", "global_steps", "last_epoch", "completed_steps",
                          "optimizer_steps", "optimizer_step", "num_updates", "update_step",
                          "opt_steps", "updates_done", "steps_done"})


def _window_counters(ctx: FileContext) -> set[str]:
    """Counters of micro-steps: ``X`` of a boundary test ``(X + 1) % K`` that a ``X += 1``
    moves on."""
    tested = {d for n in ctx.of(ast.BinOp) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
              and ctx.mentions_accum(n.right)
              for m in walk_all(n.left) if isinstance(m, ast.Name | ast.Attribute)
              and (d := dotted(m)) is not None}
    moved = {dotted(n.target) for n in ctx.of(ast.AugAssign) if isinstance(n, ast.AugAssign)
             and isinstance(n.op, ast.Add) and isinstance(n.value, ast.Constant) and n.value.value == 1}
    return {t for t in tested if t in moved}


def _step_count(ctx: FileContext, value: ast.AST) -> str | None:
    """The count of optimizer steps ``value`` reads (a name, attribute, checkpoint key or a
    property of the file returning one), when nothing multiplies it by K."""
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in walk_all(value)):
        return None
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) \
            and str(value.slice.value) in _STEP_COUNTS:
        return ast.unparse(value)
    name = dotted(value)
    if name is None:
        return None
    if last_part(name) in ("last_epoch", "global_steps", "completed_steps", "optimizer_steps"):
        return name
    props = [f for f in ctx.defs_by_name().get(last_part(name), [])
             if any(dotted(d) == "property" for d in f.decorator_list)]
    if len(props) == 1:
        ret = next((n.value for n in ast.walk(props[0]) if isinstance(n, ast.Return)
                    and n.value is not None), None)
        inner = _step_count(ctx, ret) if ret is not None and dotted(ret) != name else None
        return f"{name} (= {inner})" if inner is not None else None
    return name if last_part(name) in _STEP_COUNTS else None


@rule("AG332")
def micro_counter_restored_from_step_count(ctx: FileContext) -> Iterator[Finding]:
    counters = _window_counters(ctx)
    if not counters:
        return
    for node in ctx.of(ast.Assign):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1 \
                or (target := dotted(node.targets[0])) not in counters:
            continue
        count = _step_count(ctx, node.value)
        if count is None:
            continue
        yield ctx.finding(
            "AG332",
            node,
            f"the micro-step counter `{target}` (its `% K` decides the window's boundary) is "
            f"set from `{count}`, a count of optimizer steps: each optimizer step used K "
            "micro-steps, so the run resumes K times too early in the data (micro-batches "
            "trained again) and its windows no longer line up with the steps",
        )
