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

The client shape: a torch scheduler handed to ``deepspeed.initialize(lr_scheduler=sched)``
is stepped by the engine the same way, once per optimizer step. Its horizon (``T_max``,
``total_iters``, ...) or a ``StepLR``'s period (``step_size=len(loader)``, "decay every
epoch") counted in the loader's micro-batches is GA times long: the decay comes every GA
epochs, the anneal never gets past 1/GA of its way.
"""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import FUNCS, call_attr, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.families._horizonexpr import (
    divides,
    expand,
    horizon_expr,
    iterated,
    len_args,
    outside_len,
)

__all__ = ["deepspeed_client_horizons", "deepspeed_micro_horizons"]

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


def _engine_walks(ctx: FileContext, loader: str, *, innermost: bool = False) -> bool:
    """A loop over ``loader`` whose body calls an engine's backward (``engine.backward(loss)``);
    with ``innermost``, a backward whose nearest loop is that one (one backward per batch of
    the loader, not per batch of an inner loop over a window's micro-batches)."""
    for loop in ctx.of(ast.For, ast.AsyncFor):
        if iterated(loop) != loader:
            continue
        if any(isinstance(c, ast.Call) and call_attr(c) == "backward" and c.args
               and ctx.kind_of_receiver(c.func.value) == "engine"  # type: ignore[attr-defined]
               and (not innermost or ctx.enclosing(c, (ast.For, ast.AsyncFor, ast.While)) is loop)
               for c in ctx.local_nodes(loop)):
            return True
    return False


def _counted_loader(ctx: FileContext, parts: list[ast.AST]) -> str | None:
    """The one loader whose ``len()`` a horizon's parts count, with no division and no K
    outside it: a plain count of that loader's micro-batches."""
    loaders = len_args(parts)
    if len(loaders) != 1 or divides(parts) or any(
            ctx.mentions_accum(n) for p in parts for n in outside_len(p)
            if isinstance(n, ast.Name | ast.Attribute)):
        return None
    return next(iter(loaders))


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
        loader = _counted_loader(ctx, parts)
        if loader is None or not _engine_walks(ctx, loader):
            continue
        out.append((horizon,
                    f"the config's {kind.value} `total_num_steps` "
                    f"({_shown(source, parts)}) counts the micro-batches of `{loader}`, but the "
                    f"engine accumulates gradient_accumulation_steps = {ga} of them per optimizer "
                    "step and steps its scheduler once per optimizer step: the schedule is "
                    f"{ga} times longer than training and never gets past 1/{ga} of its way"))
    return out


#: torch schedulers whose argument is a period, not an end: (keyword, position)
_PERIOD_ARG = {"StepLR": ("step_size", 1)}


def _config_ga(ctx: FileContext) -> int | None:
    """The ``gradient_accumulation_steps`` every config dict of the file gives, when they agree."""
    found = {ctx.int_value(_entry(d, "gradient_accumulation_steps")) for d in ctx.of(ast.Dict)
             if _entry(d, "gradient_accumulation_steps") is not None}
    return found.pop() if len(found) == 1 else None


def _client_scheduler(ctx: FileContext, name: str) -> tuple[ast.Call, ast.AST, str] | None:
    """(constructor, horizon or period, what it is) of the one scheduler built under ``name``."""
    ctors = [v for v in ctx.values_by_name().get(name, []) if isinstance(v, ast.Call)]
    if len(ctors) != 1:
        return None
    ctor = ctors[0]
    kind = (dotted(ctor.func) or "").rsplit(".", 1)[-1]
    if kind in _PERIOD_ARG:
        kw, pos = _PERIOD_ARG[kind]
        period = next((k.value for k in ctor.keywords if k.arg == kw),
                      ctor.args[pos] if len(ctor.args) > pos else None)
        return (ctor, period, "period") if period is not None else None
    horizon = horizon_expr(ctx, ctor)
    return (ctor, horizon, "horizon") if horizon is not None else None


def deepspeed_client_horizons(ctx: FileContext) -> list[tuple[ast.AST, str]]:
    """(the horizon's node, the message) for each torch scheduler handed to
    ``deepspeed.initialize`` whose horizon or period counts a loader's micro-batches."""
    if not ctx.deepspeed:
        return []
    out: list[tuple[ast.AST, str]] = []
    for call in ctx.of(ast.Call):
        if call_attr(call) != "initialize" or not (dotted(call.func) or "").startswith("deepspeed"):
            continue
        given = next((k.value for k in call.keywords if k.arg == "lr_scheduler"), None)
        name = dotted(given) if given is not None else None
        ga = _config_ga(ctx)
        if name is None or ga is None or ga < 2 or (built := _client_scheduler(ctx, name)) is None:
            continue
        ctor, horizon, what = built
        loader = _counted_loader(ctx, expand(ctx, horizon))
        if loader is None or not _engine_walks(ctx, loader, innermost=True):
            continue
        kind = (dotted(ctor.func) or "").rsplit(".", 1)[-1]
        stepped = (f"`deepspeed.initialize` was given `{name}` and the engine steps it once per "
                   f"optimizer step, every gradient_accumulation_steps = {ga} micro-batches")
        if what == "period":
            out.append((horizon,
                        f"{kind}'s step_size `{ast.unparse(horizon)}` counts the micro-batches of "
                        f"`{loader}`, but {stepped}: the rate decays once per {ga} passes over "
                        f"`{loader}` instead of once per pass"))
        else:
            out.append((horizon,
                        f"{kind}'s horizon `{ast.unparse(horizon)}` counts the micro-batches of "
                        f"`{loader}`, but {stepped}: the schedule is {ga} times longer than "
                        f"training and never gets past 1/{ga} of its way"))
    return out
