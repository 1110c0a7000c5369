"""AG124's Hugging Face shape: a scheduler built by the script and handed to the Trainer
(``Trainer(..., optimizers=(optimizer, scheduler))``, TRL's trainers alike). The Trainer
steps it once per optimizer step, after ``gradient_accumulation_steps`` micro-batches, so a
horizon counted in micro-batches (``ceil(len(dataset) / per_device_train_batch_size) *
epochs``, nothing divided by the accumulation) is K times longer than training: a cosine
never anneals, the warmup lasts K times its length."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import call_attr, dotted
from accumguard.static.lint._context import FileContext

__all__ = ["hf_trainer_micro_horizon"]

_BATCH = "per_device_train_batch_size"


def _handed_to_trainer(ctx: FileContext, name: str) -> ast.Call | None:
    """The ``...Trainer(optimizers=(opt, <name>))`` call, if any."""
    calls: list[ast.Call] = ctx.of(ast.Call)
    for call in calls:
        if not (call_attr(call) or "").endswith("Trainer"):
            continue
        for k in call.keywords:
            if (k.arg == "optimizers" and isinstance(k.value, ast.Tuple) and len(k.value.elts) == 2
                    and dotted(k.value.elts[1]) == name):
                return call
    return None


def _accumulation(ctx: FileContext) -> int | None:
    """The Trainer's GA: as :meth:`FileContext.trainer_ga` reads it, or else the one integer
    the file's dict literals hold under ``"gradient_accumulation_steps"`` (a recipe dict
    handed through a function's parameter)."""
    ga = ctx.trainer_ga()[0]
    if ga is not None:
        return ga
    values = {v.value for d in ctx.of(ast.Dict) for k, v in zip(d.keys, d.values, strict=True)
              if isinstance(k, ast.Constant) and k.value == "gradient_accumulation_steps"
              and isinstance(v, ast.Constant) and type(v.value) is int}
    return next(iter(values)) if len(values) == 1 else None


def _batch_sizes(ctx: FileContext) -> set[str]:
    """How the file writes the per-device batch size it gives the Trainer's arguments (one
    pass, cached)."""
    return ctx._cached("hf_batch_sizes", ctx.tree, lambda: {  # type: ignore[no-any-return]
        ast.unparse(k.value) for c in ctx.of(ast.Call) for k in c.keywords if k.arg == _BATCH})


def _loader_len_at(ctx: FileContext, horizon: ast.AST, sizes: set[str]) -> bool:
    """``len(DataLoader(ds, batch_size=<the per-device batch size>))`` in the horizon, inline or
    through a name assigned that loader once (``count_loader = DataLoader(...)``): the
    micro-batches of one pass, counted by a loader of the Trainer's micro-batch size."""
    for n in ast.walk(horizon):
        if not (isinstance(n, ast.Call) and dotted(n.func) == "len" and n.args):
            continue
        loader: ast.AST = n.args[0]
        if isinstance(loader, ast.Name):
            values = ctx.values_by_name().get(loader.id, [])
            loader = values[0] if len(values) == 1 else loader
        if isinstance(loader, ast.Call) and call_attr(loader) == "DataLoader":
            bs = next((k.value for k in loader.keywords if k.arg == "batch_size"),
                      loader.args[1] if len(loader.args) > 1 else None)
            if bs is not None and ast.unparse(bs) in sizes:
                return True
    return False


def hf_trainer_micro_horizon(ctx: FileContext, name: str, horizon: ast.AST,
                             divisors: list[ast.AST], k_outside_len: bool,
                             parts: list[ast.AST] | None = None) -> str | None:
    """The message when ``name`` is handed to a Trainer that accumulates, and its horizon
    counts ``len(...)`` divided by the per-device batch size only, or the length of a
    DataLoader of that batch size (``parts``: the horizon and what its names hold); no K
    anywhere."""
    if k_outside_len:
        return None
    sizes = _batch_sizes(ctx)
    if not divisors and not any(_loader_len_at(ctx, p, sizes) for p in (parts or [horizon])):
        return None
    for d in divisors:
        text = ast.unparse(d)
        if "accum" in text or any(ctx.mentions_accum(n) for n in ast.walk(d)):
            return None  # divided by K too: counted in optimizer steps
        if text not in sizes and _BATCH not in text:
            return None
    trainer = _handed_to_trainer(ctx, name)
    ga = _accumulation(ctx) if trainer is not None else None
    if trainer is None or ga is None or ga <= 1:
        return None
    return (f"the schedule's horizon `{ast.unparse(horizon)}` counts micro-batches (the data's "
            f"length over the per-device batch size), but `{name}` is handed to "
            f"`{ast.unparse(trainer.func)}(optimizers=...)`, which steps it once per optimizer "
            f"step, after gradient_accumulation_steps = {ga} micro-batches: the schedule is "
            f"{ga} times longer than training (W x that on W processes) and never reaches its end")
