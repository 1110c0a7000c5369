"""AG169 (F4): a schedule horizon counted over the whole dataset while each rank walks only
its share of it.

``num_training_steps = len(train_ds) // (micro_bs * K) * epochs`` counts the optimizer steps
of ONE process that walks the whole dataset. Under a ``DistributedSampler(train_ds,
num_replicas=W)`` each rank's loader holds ``len(train_ds) / W`` samples, so each rank (and
its scheduler, stepped once per optimizer step) makes W times fewer steps than the horizon:
the schedule ends W x late and the learning rate never gets past 1/W of its decay. Judged
when the horizon reads the length of a dataset that a ``DistributedSampler`` splits (and no
other length), divides by K (so it means optimizer steps), holds no world-size factor, and
the scheduler is stepped at an accumulation boundary. The horizon is read through names
assigned once and through a helper of the file that returns it in a tuple
(``total, warmup = plan_schedule(cfg, train_ds)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import WORLD_RE, call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import (
    divides,
    expand,
    len_args,
    outside_len,
    schedulers,
    window_of,
)

__all__ = ["horizon_over_whole_dataset"]


def _split_datasets(ctx: FileContext) -> set[str]:
    """Datasets a ``DistributedSampler`` is built on (first argument or ``dataset=``)."""
    out: set[str] = set()
    for c in ctx.of(ast.Call):
        if call_attr(c) != "DistributedSampler" and dotted(c.func) != "DistributedSampler":
            continue
        ds = c.args[0] if c.args else next((k.value for k in c.keywords if k.arg == "dataset"),
                                           None)
        if ds is not None and (d := dotted(ds)):
            out.add(d)
    return out


def _through_tuple_helper(ctx: FileContext, expr: ast.AST) -> ast.AST:
    """``total`` of ``total, warmup = plan(cfg, ds)`` read as the first element of the tuple
    ``plan``'s one ``return`` gives (a function of the file); ``expr`` otherwise."""
    if not isinstance(expr, ast.Name):
        return expr
    scope = ctx.scope_of(expr)
    for n in ctx.local_nodes(scope):
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Call)
                and isinstance(n.value.func, ast.Name)):
            continue
        names = [dotted(e) for e in n.targets[0].elts]
        if expr.id not in names:
            continue
        defs = ctx.defs_by_name().get(n.value.func.id, [])
        rets = [r for r in walk_all(defs[0]) if isinstance(r, ast.Return)] if len(defs) == 1 else []
        if len(rets) == 1 and isinstance(rets[0].value, ast.Tuple) \
                and len(rets[0].value.elts) == len(names):
            got: ast.AST = rets[0].value.elts[names.index(expr.id)]
            if isinstance(got, ast.Name):  # `return total, warmup`: its value in the helper
                values = ctx.assigned_in(defs[0]).get(got.id, [])
                got = values[0] if len(values) == 1 else got
            return got
    return expr


def _stepped_per_update(ctx: FileContext, name: str) -> bool:
    """``name.step()`` runs only at an accumulation boundary of a window."""
    calls = [c for c in ctx.of(ast.Call) if call_attr(c) == "step" and dotted(receiver(c)) == name]
    if not calls:
        return False
    for c in calls:
        window = window_of(ctx, c)
        if window is None or not ctx.window_facts(window).accumulating \
                or not ctx.guarded(c, window):
            return False
    return True


@rule("AG169")
def horizon_over_whole_dataset(ctx: FileContext) -> Iterator[Finding]:
    split = _split_datasets(ctx)
    if not split:
        return
    for name, ctor, horizon in schedulers(ctx):
        source = _through_tuple_helper(ctx, horizon)
        parts = expand(ctx, source)
        lens = len_args(parts)
        whole = lens & split
        if not whole or lens - split:
            continue
        names = [d for p in parts for n in outside_len(p)
                 if isinstance(n, ast.Name | ast.Attribute) and (d := dotted(n))]
        if any(WORLD_RE.search(d.rsplit(".", 1)[-1].lower()) or "replica" in d.lower()
               for d in names):
            continue  # the world size is in the arithmetic: not judged
        if not any(ctx.mentions_accum(n) for d in divides(parts) for n in walk_all(d)):
            continue  # not a count of optimizer steps (AG124 judges micro-batch counts)
        if not _stepped_per_update(ctx, name):
            continue
        ds = sorted(whole)[0]
        shown = f"`{ast.unparse(source)}`"
        counted = next((p for p in parts[1:] if len_args([p])), None)
        if counted is not None:
            shown += f" (from `{ast.unparse(counted)}`)"
        yield ctx.finding(
            "AG169",
            ctor,
            f"the schedule's horizon {shown} counts the optimizer steps of the whole "
            f"`{ds}`, but a `DistributedSampler` gives each rank only its share of it: each "
            f"rank's loader, and `{name}.step()` once per optimizer step, make W times fewer "
            "steps, so the schedule ends W x late and never gets past 1/W of its way",
        )
