"""AG124's Accelerate shape: a scheduler prepared by ``accelerator.prepare`` with
``Accelerator(gradient_accumulation_steps=K > 1)`` and stepped inside ``with
accelerator.accumulate(model):`` advances only on the sync steps (once per window; times
``num_processes``, which a horizon read from the loader *before* ``prepare`` already counts),
so a horizon of ``epochs * len(loader)`` micro-batches with no division by K is K times long.
A horizon read from the prepared (per-process) loader is off by K / W: not judged here, unless
it is multiplied by ``num_processes`` (the recipe of Accelerate's examples without its
``/ gradient_accumulation_steps``): then it is K times long as well."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.families._horizonexpr import multiplies_by_world
from accumguard.static.lint.families._modguard import k_values

__all__ = ["accelerate_ga_above_one", "accelerate_micro_horizon"]


def _is_accelerator(ctx: FileContext, expr: ast.AST | None) -> bool:
    return ctx.is_accelerator(expr)


def _prepare_calls(ctx: FileContext) -> list[tuple[list[ast.AST], ast.Call, int]]:
    """(targets of the assignment, the ``prepare`` call, its line) of each ``... = acc.prepare(...)``."""
    def compute() -> list[tuple[list[ast.AST], ast.Call, int]]:
        out = []
        for node in ctx.of(ast.Assign):
            v = node.value
            if isinstance(v, ast.Call) and call_attr(v) == "prepare" and _is_accelerator(ctx, receiver(v)):
                t = node.targets[0]
                out.append((list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t], v, node.lineno))
        return out
    return ctx._cached("acchorizon_prepares", ctx.tree, compute)  # type: ignore[no-any-return]


def _settings_in_sight(ctx: FileContext) -> bool:
    """Every ``Accelerator(...)`` leaves the per-process stepping as Accelerate's default."""
    def compute() -> bool:
        for c in ctx.of(ast.Call):
            if (dotted(c.func) or "").rsplit(".", 1)[-1] == "Accelerator":
                for k in c.keywords:
                    if k.arg in (None, "split_batches", "step_scheduler_with_optimizer", "dataloader_config"):
                        return False
        return True
    return bool(ctx._cached("acchorizon_settings", ctx.tree, compute))


def _in_accumulate(ctx: FileContext, node: ast.AST) -> ast.AST | None:
    """The loop around the ``with <accelerator>.accumulate(...)`` that holds ``node``."""
    cur = ctx.parents.get(node)
    inside = False
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        if isinstance(cur, ast.With | ast.AsyncWith) and any(
                isinstance(i.context_expr, ast.Call) and call_attr(i.context_expr) == "accumulate"
                and _is_accelerator(ctx, receiver(i.context_expr)) for i in cur.items):
            inside = True
        elif inside and isinstance(cur, ast.For | ast.AsyncFor):
            return cur
        cur = ctx.parents.get(cur)
    return None


def _step_calls(ctx: FileContext) -> dict[str, list[ast.Call]]:
    """``x.step()`` calls by receiver, cached."""
    def compute() -> dict[str, list[ast.Call]]:
        out: dict[str, list[ast.Call]] = {}
        for c in ctx.of(ast.Call):
            if call_attr(c) == "step" and not c.args:
                out.setdefault(dotted(receiver(c)) or "", []).append(c)
        return out
    return ctx._cached("acchorizon_steps", ctx.tree, compute)  # type: ignore[no-any-return]


def accelerate_micro_horizon(ctx: FileContext, name: str, parts: list[ast.AST],
                             loaders: set[str]) -> tuple[str, bool] | None:
    """(the loader whose micro-batches the horizon of scheduler ``name`` counts, whether
    ``prepare`` took the scheduler), when every step of it runs inside
    ``accelerator.accumulate`` of a loop over that loader with GA > 1 and no K is in the
    horizon: a prepared scheduler (the horizon read before ``prepare``; the name ``prepare``
    returns it as counts too) advances only on the sync steps, and an unprepared one stepped
    only under ``if accelerator.sync_gradients:`` once per window too. Else None."""
    if not accelerate_ga_above_one(ctx) or not _settings_in_sight(ctx):
        return None
    prepares = _prepare_calls(ctx)
    aliases = {name}
    for ts, call, _ in prepares:
        for t, a in zip(ts, call.args, strict=False):
            if dotted(a) == name and (dt := dotted(t)) is not None:
                aliases.add(dt)  # `..., self.sched = acc.prepare(..., sched)`
    prepared = len(aliases) > 1 or any(dotted(t) == name for ts, _, _ in prepares for t in ts)
    steps = [c for a in aliases for c in _step_calls(ctx).get(a, [])]
    if not steps or (not prepared and not all(_under_sync_gradients(ctx, c) for c in steps)):
        return None  # (an unprepared scheduler stepped on every micro-batch is AG103's)
    lens = [n for p in parts for n in walk_all(p) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "len" and len(n.args) == 1 and dotted(n.args[0]) in loaders]
    # read after the loader was prepared: one process's shard, off by K / W; times
    # `num_processes` (the scheduler's steps per optimizer step) it is K times long again
    if prepared and any(dotted(t) == dotted(n.args[0]) and line < n.lineno
                        for n in lens for ts, _, line in prepares for t in ts) \
            and not multiplies_by_world(parts, ctx):
        return None
    # the prepared loader: the prepare output at the position of a counted loader
    prepared_as: dict[str, str] = {}
    for ts, call, _ in prepares:
        for t, a in zip(ts, call.args, strict=False):
            if (da := dotted(a)) in loaders and (dt := dotted(t)) is not None:
                prepared_as[dt] = da
    found: str | None = None
    for call in steps:
        loop = _in_accumulate(ctx, call)
        it = loop.iter if isinstance(loop, ast.For | ast.AsyncFor) else None
        if isinstance(it, ast.Call) and call_attr(it) in ("enumerate", "tqdm") and it.args:
            it = it.args[0]
        d = dotted(it) if it is not None else None
        loader = d if d in loaders else prepared_as.get(d or "")
        if loader is None:
            return None
        found = loader
    if found is None:
        return None
    todo: list[ast.AST] = list(parts)
    while todo:  # the horizon's arithmetic, outside len(...)
        node = todo.pop()
        if isinstance(node, ast.Call) and (dotted(node.func) or "").rsplit(".", 1)[-1] == "Accelerator":
            continue  # (the value of `accelerator` in `accelerator.num_processes`, not arithmetic)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.FloorDiv):
            return None  # scaled by something: not a plain count of batches
        if isinstance(node, ast.Name | ast.Attribute) and ctx.mentions_accum(node):
            return None  # K is in the horizon
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"):
            todo.extend(ast.iter_child_nodes(node))
    return found, prepared


def _under_sync_gradients(ctx: FileContext, call: ast.AST) -> bool:
    """``call`` runs only in the body of an ``if <accelerator>.sync_gradients:`` (once per
    window, when the optimizer steps)."""
    child, cur = call, ctx.parents.get(call)
    while cur is not None and not isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        if isinstance(cur, ast.If) and child in cur.body and isinstance(cur.test, ast.Attribute) \
                and cur.test.attr == "sync_gradients" and _is_accelerator(ctx, cur.test.value):
            return True
        child, cur = cur, ctx.parents.get(cur)
    return False


def accelerate_ga_above_one(ctx: FileContext) -> bool:
    """``Accelerator(gradient_accumulation_steps=K)`` in sight with every value K > 1 (once
    per file: it is asked for every Accelerate window)."""
    def compute() -> bool:
        values: set[int | None] = set()
        for call in ctx.of(ast.Call):
            if (dotted(call.func) or "").split(".")[-1] == "Accelerator":
                for kw in call.keywords:
                    if kw.arg == "gradient_accumulation_steps":
                        values |= k_values(ctx, kw.value, call)  # a parameter's default and callers too
        return bool(values) and all(v is not None and v > 1 for v in values)
    return bool(ctx._cached("accelerate_ga_above_one", ctx.tree, compute))
