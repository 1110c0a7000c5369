"""AG124's DeepSpeed shape: a scheduler of the config (``"scheduler": {"type":
"WarmupDecayLR", "params": {"total_num_steps": ...}}``) whose horizon counts a loader's
micro-batches while the engine accumulates GA > 1 of them per optimizer step.

DeepSpeed steps the scheduler its config names inside ``engine.step()`` at each
accumulation boundary, once per optimizer step. ``total_num_steps = epochs * len(loader)``
over the loader the engine's loop walks one micro-batch per ``engine.backward`` is GA times
the steps the run makes: the decay never gets past 1/GA of its way. Judged only when the
config's ``gradient_accumulation_steps`` is an integer above 1 the file spells, the horizon
holds no K (``// GA``) and no other divisor than that loader's batch size, and a loop over
that loader calls an engine's backward.
"""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, call_attr
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.families._horizonexpr import (
    divides,
    expand,
    iterated,
    len_args,
    outside_len,
)

__all__ = ["deepspeed_micro_horizons"]

#: DeepSpeed's schedulers whose end is ``total_num_steps``
_DECAYING = ("WarmupDecayLR", "WarmupCosineLR")


def _entry(d: ast.Dict, key: str) -> ast.AST | None:
    return next((v for k, v in zip(d.keys, d.values, strict=True)
                 if isinstance(k, ast.Constant) and k.value == key), None)


def _from_caller(ctx: FileContext, name: ast.AST) -> ast.AST:
    """A parameter of the enclosing function read as the argument its one call passes."""
    fn = ctx.enclosing(name, FUNCS)
    if not isinstance(name, ast.Name) or not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return name
    params = [a.arg for a in fn.args.args]
    if name.id not in params:
        return name
    calls = [c for c in ctx.of(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == fn.name]
    if len(calls) != 1:
        return name
    call = calls[0]
    given = next((k.value for k in call.keywords if k.arg == name.id), None)
    i = params.index(name.id)
    if given is None and i < len(call.args):
        given = call.args[i]
    return given if given is not None else name


def _engine_walks(ctx: FileContext, loader: str) -> bool:
    """A loop over ``loader`` whose body calls an engine's backward (``engine.backward(loss)``)."""
    for loop in ctx.of(ast.For, ast.AsyncFor):
        if iterated(loop) != loader:
            continue
        if any(isinstance(c, ast.Call) and call_attr(c) == "backward" and c.args
               and ctx.kind_of_receiver(c.func.value) == "engine"  # type: ignore[attr-defined]
               for c in ctx.local_nodes(loop)):
            return True
    return False


def _shown(source: ast.AST, parts: list[ast.AST]) -> str:
    text = f"`{ast.unparse(source)}`"
    return text + f" = `{ast.unparse(parts[1])}`" if len(parts) > 1 and isinstance(source, ast.Name) else text


def deepspeed_micro_horizons(ctx: FileContext) -> list[tuple[ast.AST, str]]:
    """(the horizon's node, the message) for each config scheduler sized in micro-batches."""
    if not ctx.deepspeed:
        return []
    out: list[tuple[ast.AST, str]] = []
    for d in ctx.of(ast.Dict):
        sched = _entry(d, "scheduler")
        if not isinstance(sched, ast.Dict):
            continue
        kind = _entry(sched, "type")
        params = _entry(sched, "params")
        horizon = _entry(params, "total_num_steps") if isinstance(params, ast.Dict) else None
        ga = ctx.int_value(_entry(d, "gradient_accumulation_steps"))
        if not (isinstance(kind, ast.Constant) and kind.value in _DECAYING) \
                or horizon is None or ga is None or ga < 2:
            continue
        source = _from_caller(ctx, horizon)
        if isinstance(source, ast.Call) and (fn := ctx.callee_of(source)) is not None:
            rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
            source = rets[0] if len(rets) == 1 else source  # `self.total_training_steps()`
        parts = expand(ctx, source)
        loaders = len_args(parts)
        if len(loaders) != 1 or divides(parts) or any(
                ctx.mentions_accum(n) for p in parts for n in outside_len(p)
                if isinstance(n, ast.Name | ast.Attribute)):
            continue
        loader = next(iter(loaders))
        if not _engine_walks(ctx, loader):
            continue
        out.append((horizon,
                    f"the config's {kind.value} `total_num_steps` "
                    f"({_shown(source, parts)}) counts the micro-batches of `{loader}`, but the "
                    f"engine accumulates gradient_accumulation_steps = {ga} of them per optimizer "
                    "step and steps its scheduler once per optimizer step: the schedule is "
                    f"{ga} times longer than training and never gets past 1/{ga} of its way"))
    return out
