"""AG169 (F4): a schedule horizon counted over the whole dataset while each rank walks only
its share of it.

``num_training_steps = len(train_ds) // (micro_bs * K) * epochs`` counts the optimizer steps
of ONE process that walks the whole dataset. Under a ``DistributedSampler(train_ds,
num_replicas=W)`` each rank's loader holds ``len(train_ds) / W`` samples, so each rank (and
its scheduler, stepped once per optimizer step) makes W times fewer steps than the horizon:
the schedule ends W x late and the learning rate never gets past 1/W of its decay. Judged
when the horizon reads the length of a dataset that a ``DistributedSampler`` splits (and no
other length), or the number its tensors were built with (``cfg.num_samples`` in
``torch.randint(0, V, (cfg.num_samples, L))``), divides by K (so it means optimizer steps), holds no world-size factor, and
the scheduler is stepped at an accumulation boundary. The horizon is read through names
assigned once and through a helper of the file that returns it in a tuple
(``total, warmup = plan_schedule(cfg, train_ds)``).

AG175 (F4): the same split in a schedule written by hand that counts data consumed (minGPT's
``self.tokens += (y >= 0).sum()``): the count is this rank's own (never all-reduced) while the
horizon it is compared with counts the whole dataset a ``DistributedSampler`` splits
(``final_tokens = epochs * len(ds) * block_size``): each rank consumes 1/W of it, so the
schedule moves W x slow and never gets past 1/W of its decay.

AG353 (F4): the other way round: the horizon reads the length of a loader built on a
``DistributedSampler`` (``len(self.loader)``: this rank's micro-batches already) and divides
by the world size as well as by K (``epochs * len(loader) // (K * W)``): the schedule ends W x
early (the learning rate reaches its end halfway through the run on two ranks).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, WORLD_RE, call_attr, dotted, receiver, walk_all
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

__all__ = ["horizon_over_whole_dataset", "rank_local_progress_against_whole_dataset",
           "rank_loader_horizon_divided_by_world"]

#: a counter of data consumed (tokens, samples) and a horizon in the same units
_PROGRESS = re.compile(r"^(n_)?(tokens?|samples?|examples?)(_seen|_consumed|_processed)?$|"
                       r"^(seen|consumed|processed)_(tokens|samples|examples)$", re.IGNORECASE)
_DATA_HORIZON = re.compile(r"(final|total|max|train)_?(tokens|samples|examples)|"
                           r"(tokens|samples|examples)_?(total|budget)", re.IGNORECASE)


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


#: tensor constructors whose first dimension is the number of samples they make
_MAKERS = frozenset({"randint", "randn", "rand", "zeros", "ones", "empty", "full", "arange",
                     "randperm", "normal", "linspace"})


def _first_dim(call: ast.Call) -> ast.AST | None:
    """The first dimension a tensor constructor is given (``randint(0, V, (N, L))`` -> N,
    ``randn(N, D)`` -> N, ``arange(N)`` -> N)."""
    name = call_attr(call) or (dotted(call.func) or "")
    size: ast.AST | None = next((k.value for k in call.keywords if k.arg == "size"), None)
    if size is None and name == "randint":
        size = call.args[2] if len(call.args) > 2 else call.args[1] if len(call.args) == 2 else None
    elif size is None and name in ("arange", "randperm", "linspace") and call.args:
        size = call.args[-1] if name != "linspace" else (call.args[2] if len(call.args) > 2 else None)
    elif size is None and call.args:
        size = call.args[0]
    if isinstance(size, ast.Tuple | ast.List):
        return size.elts[0] if size.elts else None
    return size


def _split_sizes(ctx: FileContext) -> dict[str, str]:
    """The names a dataset that a ``DistributedSampler`` splits is sized by (the first
    dimension of the tensors it is built from, ``cfg.num_samples``), each with the dataset's
    name: a horizon reading that name counts the whole dataset, as ``len(ds)`` would."""
    def compute() -> dict[str, str]:
        out: dict[str, str] = {}
        for c in ctx.of(ast.Call):
            if call_attr(c) != "DistributedSampler" and dotted(c.func) != "DistributedSampler":
                continue
            ds = c.args[0] if c.args else next((k.value for k in c.keywords if k.arg == "dataset"), None)
            if ds is None or not (name := dotted(ds)):
                continue
            for part in expand(ctx, ds, depth=4):
                for n in walk_all(part):
                    if isinstance(n, ast.Call) and (call_attr(n) or dotted(n.func) or "").rsplit(".", 1)[-1] in _MAKERS \
                            and isinstance(dim := _first_dim(n), ast.Name | ast.Attribute) \
                            and (d := dotted(dim)):
                        out.setdefault(d, name)
        return out
    return ctx._cached("split_sizes", ctx.tree, compute)  # type: ignore[no-any-return]


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
        sites: list[ast.AST] = [c]
        if window_of(ctx, c) is None:
            # a step helper of the file (``def optimizer_step(self): ...; self.scheduler.step()``)
            # run from the loop: judged at its calls
            fn = ctx.enclosing(c, FUNCS)
            sites = list(ctx.call_sites(fn)) if fn is not None else []
        if not sites:
            return False
        for site in sites:
            window = window_of(ctx, site)
            if window is None or not ctx.window_facts(window).accumulating \
                    or not ctx.guarded(site, window):
                return False
    return True


def _horizons(ctx: FileContext) -> Iterator[tuple[str, ast.AST, ast.AST, list[ast.AST], set[str]]]:
    """Per scheduler of the file: its name, its construction, the horizon expression (through
    a tuple helper), the expression's parts followed through names, and the names whose
    ``len()`` they read."""
    for name, ctor, horizon in schedulers(ctx):
        source = _through_tuple_helper(ctx, horizon)
        parts = expand(ctx, source)
        yield name, ctor, source, parts, len_args(parts)


@rule("AG169")
def horizon_over_whole_dataset(ctx: FileContext) -> Iterator[Finding]:
    split = _split_datasets(ctx)
    if not split:
        return
    sizes = _split_sizes(ctx)
    for name, ctor, source, parts, lens in _horizons(ctx):
        names = [d for p in parts for n in outside_len(p)
                 if isinstance(n, ast.Name | ast.Attribute) and (d := dotted(n))]
        whole = lens & split
        sized = sorted({d for d in names if d in sizes}) if not lens else []
        if not (whole or sized) or lens - split:
            continue
        if any(WORLD_RE.search(d.rsplit(".", 1)[-1].lower()) or "replica" in d.lower()
               for d in names):
            continue  # the world size is in the arithmetic: not judged
        if not any(ctx.mentions_accum(n) for d in divides(parts) for p in expand(ctx, d)
                   for n in walk_all(p)):
            continue  # not a count of optimizer steps (AG124 judges micro-batch counts)
        if not _stepped_per_update(ctx, name):
            continue
        ds = sorted(whole)[0] if whole else sizes[sized[0]]
        shown = f"`{ast.unparse(source)}`"
        counted = next((p for p in parts[1:] if len_args([p])), None)
        if counted is not None:
            shown += f" (from `{ast.unparse(counted)}`)"
        elif sized:
            shown += f" (from `{sized[0]}`, the number of samples `{ds}` is built with)"
        yield ctx.finding(
            "AG169",
            ctor,
            f"the schedule's horizon {shown} counts the optimizer steps of the whole "
            f"`{ds}`, but a `DistributedSampler` gives each rank only its share of it: each "
            f"rank's loader, and `{name}.step()` once per optimizer step, make W times fewer "
            "steps, so the schedule ends W x late and never gets past 1/W of its way",
        )


def _last(node: ast.AST) -> str:
    return (dotted(node) or "").rsplit(".", 1)[-1]


@rule("AG175")
def rank_local_progress_against_whole_dataset(ctx: FileContext) -> Iterator[Finding]:
    split = _split_datasets(ctx)
    if not split:
        return
    for bump in ctx.of(ast.AugAssign):
        if not (isinstance(bump.op, ast.Add) and _PROGRESS.search(_last(bump.target))):
            continue
        fn = ctx.enclosing(bump, (ast.FunctionDef, ast.AsyncFunctionDef))
        scope = fn if fn is not None else ctx.tree
        reduced = ctx.all_reduced_names(scope)
        value_names = {d for n in walk_all(bump.value) if (d := dotted(n))}
        if value_names & reduced or any(WORLD_RE.search(d.lower()) for d in value_names) \
                or any(isinstance(n, ast.Call) and call_attr(n) in ("all_reduce", "gather",
                       "all_gather", "reduce") for n in walk_all(bump.value)):
            continue  # counted over the ranks
        horizons = {_last(n) for n in walk_all(scope)
                    if isinstance(n, ast.Name | ast.Attribute) and _DATA_HORIZON.search(_last(n))}
        for h in sorted(horizons):
            values = [a.value for a in ctx.of(ast.Assign)
                      if any(_last(t) == h for t in a.targets)]
            if len(values) != 1:
                continue
            lens = {d for n in walk_all(values[0]) if isinstance(n, ast.Call)
                    and dotted(n.func) == "len" and n.args and (d := dotted(n.args[0]))}
            names = {d for n in walk_all(values[0]) if (d := dotted(n))}
            # (the dataset the sampler splits may reach the schedule under another name, a
            # trainer's `self.train_dataset` built from `ds`: one split dataset in the file
            # stands for the dataset the horizon's len() reads)
            if not lens or (lens - split and len(split) != 1) \
                    or any(WORLD_RE.search(d.rsplit(".", 1)[-1].lower()) for d in names):
                continue
            ds = sorted(lens)[0]
            yield ctx.finding(
                "AG175",
                bump,
                f"`{ast.unparse(bump)}` counts the data this rank consumed (never all-reduced), "
                f"and the schedule compares it with `{h}` = `{ast.unparse(values[0])}`, which "
                f"counts the whole `{ds}`; a `DistributedSampler` gives each rank 1/W of it, so "
                "the schedule moves W x slow and never gets past 1/W of its way",
            )
            break


def _split_loaders(ctx: FileContext) -> set[str]:
    """Names bound to a ``DataLoader(..., sampler=<a DistributedSampler>)``: each rank's share."""
    samplers = {d for a in ctx.of(ast.Assign) if isinstance(a.value, ast.Call)
                and (dotted(a.value.func) or "").endswith("DistributedSampler")
                for t in a.targets if (d := dotted(t))}
    out: set[str] = set()
    for a in ctx.of(ast.Assign):
        c = a.value
        if not (isinstance(c, ast.Call) and (dotted(c.func) or "").endswith("DataLoader")):
            continue
        smp = next((k.value for k in c.keywords if k.arg == "sampler"), None)
        if smp is None or not ((isinstance(smp, ast.Call) and (dotted(smp.func) or "").endswith(
                "DistributedSampler")) or dotted(smp) in samplers):
            continue
        out |= {d for t in a.targets if (d := dotted(t))}
    return out


@rule("AG353")
def rank_loader_horizon_divided_by_world(ctx: FileContext) -> Iterator[Finding]:
    loaders = _split_loaders(ctx)
    if not loaders:
        return
    for name, ctor, source, parts, lens in _horizons(ctx):
        if not lens or not lens <= loaders:
            continue
        divisors = [n for d in divides(parts) for n in walk_all(d)]
        world = next((d for n in divisors if isinstance(n, ast.Name | ast.Attribute)
                      and (d := dotted(n)) and (WORLD_RE.search(d.rsplit(".", 1)[-1].lower())
                                                or "replica" in d.lower())), None)
        if world is None or not any(ctx.mentions_accum(n) for n in divisors):
            continue
        if not _stepped_per_update(ctx, name):
            continue
        shown = f"`{ast.unparse(source)}`"
        counted = next((p for p in parts[1:] if len_args([p])), None)
        if counted is not None:
            shown += f" (from `{ast.unparse(counted)}`)"
        yield ctx.finding(
            "AG353", ctor,
            f"the schedule's horizon {shown} divides by the world size `{world}`, but "
            f"`{sorted(lens)[0]}` is built on a `DistributedSampler`: its length is this rank's "
            f"micro-batches already, so the horizon is W times too short and `{name}` reaches "
            "the end of its schedule after 1/W of the run",
            fix="drop the world size from the horizon: epochs * len(loader) // K is the number "
                "of optimizer steps each rank makes")
