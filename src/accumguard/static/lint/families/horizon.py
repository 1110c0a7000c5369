"""Schedule horizons (F4): the number of steps a learning-rate schedule is sized for, read
from its constructor, against the steps the loop gives it.

AG124: the horizon is counted in micro-batches (``T_max=epochs * len(loader)``, no division
by K) while the scheduler is stepped once per optimizer step, at the boundary of a window
that iterates that same loader one micro-batch at a time: the schedule is K times too long
(a cosine never anneals, a linear decay stops at a fraction of its way).
The Accelerate and Lightning shapes of AG124 are in :mod:`._acchorizon` and :mod:`._lghorizon`.

AG125: an Accelerate-prepared scheduler whose horizon divides by the number of processes
(sized in one process's optimizer steps): the prepared scheduler advances
``num_processes`` times per optimizer step (unless ``split_batches=True``), so it reaches
its end W times early and the rest of training runs at the schedule's final rate.

AG360: a scheduler prepared by an Accelerator whose loaders split each batch across the
processes (``DataLoaderConfiguration(split_batches=True)``), its horizon multiplied by
``num_processes``: under ``split_batches`` the prepared scheduler steps once per optimizer
step, so the schedule is W times long.

Only horizons whose parts are in sight are judged: a value read from a config, a
``max_steps`` argument or anything divided by a name the rule cannot place stays silent.
The count of batches may be ``len(loader)`` or ``len(dataset)`` divided by the batch size
of the ``DataLoader`` built on it; ``OneCycleLR``'s ``steps_per_epoch`` and the outside
name a ``LambdaLR`` function reads are horizons too. What is inside ``len(...)`` is not
read for K (the loader's ``batch_size=cfg["micro_batch_size"]`` is not the accumulation
count), and ``CFG["epochs"]`` of a dict literal is read as that entry, not the whole dict.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, call_attr, dotted, mult_factors, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._acchorizon import accelerate_micro_horizon
from accumguard.static.lint.families._dshorizon import (
    deepspeed_client_horizons,
    deepspeed_micro_horizons,
)
from accumguard.static.lint.families._hfhorizon import hf_trainer_micro_horizon
from accumguard.static.lint.families._horizonexpr import (
    calls_by_attr,
    constructor_name,
    divides,
    expand,
    horizon_expr,
    is_world,
    iterated,
    lambda_body,
    lambda_horizon,
    len_args,
    multiplies_by_world,
    outside_len,
    schedulers,
    window_of,
)
from accumguard.static.lint.families._lghorizon import (
    lightning_micro_horizons,
)


def _step_calls(ctx: FileContext, name: str) -> list[ast.Call]:
    def compute() -> dict[str, list[ast.Call]]:
        out: dict[str, list[ast.Call]] = {}
        for c in calls_by_attr(ctx).get("step", []):
            out.setdefault(dotted(receiver(c)) or "", []).append(c)
        return out
    by_receiver: dict[str, list[ast.Call]] = ctx._cached("horizon_steps", ctx.tree, compute)
    return by_receiver.get(name, [])


def _loader_of(ctx: FileContext, loader: str) -> tuple[str, ast.AST] | None:
    """(dataset, batch size) of ``loader = DataLoader(dataset, batch_size=...)``, the one
    assignment of that name: a horizon ``len(dataset) // batch_size * epochs`` counts its
    batches as surely as ``len(loader) * epochs``."""
    values = ctx.values_by_name().get(loader, [])
    if len(values) != 1 or not isinstance(call := values[0], ast.Call) or call_attr(call) != "DataLoader":
        return None
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    dataset = call.args[0] if call.args else kw.get("dataset")
    bs = call.args[1] if len(call.args) > 1 else kw.get("batch_size")
    ds_name = dotted(dataset) if dataset is not None else None
    if ds_name is None or bs is None or any(k in kw for k in ("batch_sampler", "sampler")):
        return None
    return ds_name, bs


def _counts_batches(ctx: FileContext, parts: list[ast.AST], loaders: set[str],
                    window: ast.AST) -> str | None:
    """The loader the window iterates, when the horizon is its number of batches times
    something with no K in it: ``len(loader)``, or ``len(dataset)`` divided by the
    loader's own batch size; else None."""
    loader = iterated(window)
    if loader is None:
        return None
    sizes: set[str] = set()
    if loader not in loaders:
        built = _loader_of(ctx, loader)
        if built is None or built[0] not in loaders:
            return None
        sizes = {ast.unparse(built[1])}
    if any(isinstance(n, ast.Call) and ctx.callee_of(n) is not None
           and any(isinstance(a, ast.Call) and call_attr(a) == "len"
                   for arg in n.args for a in walk_all(arg))
           for p in parts for n in walk_all(p)):
        return None  # the count goes through a function of the file (`windows_per_epoch(len(
        # loader))`): it may convert micro-batches to windows; not a plain count of batches
    divisors = divides(parts)
    if any(ast.unparse(d) not in sizes for d in divisors):
        return None  # scaled by something (`// K`, `/ world`): not a plain count of batches
    return None if _k_outside(ctx, parts, divisors) else loader


def _k_outside(ctx: FileContext, parts: list[ast.AST], skipped: list[ast.AST]) -> bool:
    """K is in the horizon's arithmetic somewhere, outside ``len(...)`` and ``skipped``."""
    skip = {id(n) for d in skipped for n in walk_all(d)}
    return any(id(n) not in skip and isinstance(n, ast.Name | ast.Attribute | ast.Constant)
               and ctx.mentions_accum(n) for p in parts for n in outside_len(p))


def _window_of_step(ctx: FileContext, call: ast.Call) -> tuple[ast.AST | None, ast.AST]:
    """The window a scheduler step runs in, and the node of that window that runs it: the
    step itself, or the call of the file's helper holding it (``self._optimizer_step()``
    under the window's boundary test), one helper deep."""
    window = window_of(ctx, call)
    if window is not None:
        return window, call
    fn = ctx.enclosing(call, FUNCS)
    sites = ctx.call_sites(fn) if fn is not None else []
    found = [(w, site) for site in sites if (w := window_of(ctx, site)) is not None]
    return found[0] if len(found) == 1 and len(sites) == 1 else (None, call)


@rule("AG124")
def horizon_in_micro_batches(ctx: FileContext) -> Iterator[Finding]:
    for name, ctor, horizon in schedulers(ctx):
        parts = expand(ctx, horizon)
        loaders = len_args(parts)
        if not loaders:
            # not a count of a named loader's batches; a Trainer's scheduler may still count
            # `len(DataLoader(ds, batch_size=per_device))`
            divisors = divides(parts)
            hf = hf_trainer_micro_horizon(ctx, name, horizon, divisors,
                                          _k_outside(ctx, parts, divisors), parts)
            if hf is not None:
                yield ctx.finding("AG124", ctor, hf, fix=_HF_FIX)
            continue
        accelerate = accelerate_micro_horizon(ctx, name, parts, loaders)
        if accelerate is not None:
            loader, prepared = accelerate
            how = (f"`Accelerator(gradient_accumulation_steps=K > 1)` prepared `{name}` and steps "
                   "it only when the optimizer steps" if prepared else
                   f"`{name}.step()` runs only under `accelerator.sync_gradients`, when the "
                   "optimizer steps")
            yield ctx.finding(
                "AG124",
                ctor,
                f"the schedule's horizon `{ast.unparse(horizon)}` counts the micro-batches of "
                f"`{loader}`, but {how}, once per window of K (`accelerator.accumulate`): the "
                "schedule is K times longer than training"
                + ("" if prepared else " (K x W when the loader is counted before `prepare` "
                   "shards it over W processes)") + " and never reaches its end",
            )
            continue
        divisors = divides(parts)
        hf = hf_trainer_micro_horizon(ctx, name, horizon, divisors, _k_outside(ctx, parts, divisors),
                                      parts)
        if hf is not None:
            yield ctx.finding("AG124", ctor, hf, fix=_HF_FIX)
            continue
        steps = _step_calls(ctx, name)
        if not name.startswith("self.") and (own := ctx.scope_of(ctor)) is not ctx.tree:
            # a local scheduler: its own function's calls (a reference run's `sched` is another)
            steps = [c for c in steps if ctx.scope_of(c) is own]
        if not steps:
            continue
        iterated: list[str] = []
        for call in steps:
            window, site = _window_of_step(ctx, call)
            if window is None:
                break
            facts = ctx.window_facts(window)
            if (not facts.accumulating or facts.accelerate or facts.summed_loss
                    or facts.unguarded_optimizer_steps
                    # (the boundary's `if` around the helper's call, or the helper's own)
                    or not (ctx.guarded(site, window) or ctx.guarded(call, window))):
                break
            counted = _counts_batches(ctx, parts, loaders, window)
            if counted is None:
                break
            iterated.append(counted)
        else:
            yield ctx.finding(
                "AG124",
                ctor,
                f"the schedule's horizon `{ast.unparse(horizon)}` counts the micro-batches of "
                f"`{iterated[0]}`, but `{name}.step()` runs once per optimizer step (the boundary at line "
                f"{steps[0].lineno}): the schedule is K times longer than training and never "
                "reaches its end",
            )
    for ctor, message in lightning_micro_horizons(ctx, horizon_expr):
        yield ctx.finding("AG124", ctor, message, fix=_LIGHTNING_FIX)
    for node, message in deepspeed_micro_horizons(ctx):
        yield ctx.finding("AG124", node, message, fix=_DS_FIX)
    for node, message in deepspeed_client_horizons(ctx):
        yield ctx.finding("AG124", node, message, fix=_DS_CLIENT_FIX)


_HF_FIX = ("size the horizon in optimizer steps: divide the micro-batches per epoch by "
           "gradient_accumulation_steps (`math.ceil(len(dataset) / (per_device_train_batch_size * "
           "gradient_accumulation_steps)) * epochs`), or let the Trainer build the scheduler "
           "(lr_scheduler_type, warmup_ratio), which counts in optimizer steps")
_DS_FIX = ("size total_num_steps in optimizer steps: the micro-batches per epoch divided by "
           "gradient_accumulation_steps, times the epochs (`epochs * len(loader) // GA`)")
_DS_CLIENT_FIX = ("count the scheduler in optimizer steps, the steps DeepSpeed gives it: divide the "
                  "micro-batches by gradient_accumulation_steps (`len(loader) // GA` per epoch), or "
                  "step the scheduler yourself and do not pass it to `deepspeed.initialize`")
_LIGHTNING_FIX = ("size the horizon in optimizer steps: `self.trainer.estimated_stepping_batches` (it "
                  "counts accumulate_grad_batches and max_epochs), or divide the batches per epoch by "
                  "accumulate_grad_batches: `math.ceil(len(self.train_dataloader()) / "
                  "self.trainer.accumulate_grad_batches) * self.trainer.max_epochs`")


def _accelerate_prepares(ctx: FileContext, name: str) -> bool:
    """``name`` is passed to ``accelerator.prepare(...)`` (or ``prepare_scheduler``) of an
    ``Accelerator`` that is not built with ``split_batches=True`` and does not step the
    scheduler apart from the optimizer."""
    return bool(ctx._cached("accelerate_prepares:" + name, ctx.tree,
                            lambda: _accelerate_prepares_uncached(ctx, name)))


def _accelerate_prepares_uncached(ctx: FileContext, name: str) -> bool:
    calls = calls_by_attr(ctx)
    prepared = any(
        ctx.is_accelerator(receiver(c))
        and any(dotted(a) == name for a in c.args)
        for c in calls.get("prepare", []) + calls.get("prepare_scheduler", [])
    )
    if not prepared:
        return False
    for c in calls.get("Accelerator", []):
        if constructor_name(c) == "Accelerator":
            for k in c.keywords:
                if k.arg in ("split_batches", "step_scheduler_with_optimizer"):
                    return False  # set: the per-process stepping may be off
                if k.arg in (None, "dataloader_config"):
                    return False  # **kwargs or a DataLoaderConfiguration: not in sight
    return True


def _prepared_len(ctx: FileContext, parts: list[ast.AST]) -> ast.Call | None:
    """A ``len(loader)`` in the horizon read after ``loader`` was reassigned from
    ``accelerator.prepare(...)``: the prepared loader is one process's shard (Accelerate
    1.15's ``DataLoaderShard``/``BatchSamplerShard``), so its length is per process."""
    for p in parts:
        for n in walk_all(p):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
                    and len(n.args) == 1 and (loader := dotted(n.args[0]))):
                continue
            if _last_assignment_prepared(ctx, loader, n.lineno):
                return n  # the last assignment before the len() is the prepared loader
    return None


def _last_assignment_prepared(ctx: FileContext, name: str, line: int) -> bool:
    """The last assignment of ``name`` on a line before ``line`` is (one of the assignments of
    that line is) from ``accelerator.prepare``: a bisection in the name's assignments."""
    assigns = _assigns_by_target(ctx).get(name, [])
    i = bisect_left(assigns, line, key=lambda x: x[0])
    if i == 0:
        return False
    last = assigns[i - 1][0]
    while i > 0 and assigns[i - 1][0] == last:
        if assigns[i - 1][1]:
            return True
        i -= 1
    return False


def _accelerate_k_is_one(ctx: FileContext) -> bool:
    return bool(ctx._cached("accelerate_k_is_one", ctx.tree, lambda: _accelerate_k_is_one_uncached(ctx)))


def _accelerate_k_is_one_uncached(ctx: FileContext) -> bool:
    """Every ``Accelerator(...)`` in sight leaves ``gradient_accumulation_steps`` at 1."""
    calls = [c for c in calls_by_attr(ctx).get("Accelerator", []) if constructor_name(c) == "Accelerator"]
    return bool(calls) and all(
        k.arg is not None and (k.arg != "gradient_accumulation_steps" or ctx.int_value(k.value) == 1)
        for c in calls for k in c.keywords
    )


def _assigns_by_target(ctx: FileContext) -> dict[str, list[tuple[int, bool]]]:
    """Per assigned name: (line, assigned from ``accelerator.prepare``) of each assignment."""
    def compute() -> dict[str, list[tuple[int, bool]]]:
        out: dict[str, list[tuple[int, bool]]] = {}
        for node in ctx.of(ast.Assign):
            prepared = _is_prepare(ctx, node.value)
            for name in _target_names(node):
                out.setdefault(name, []).append((node.lineno, prepared))
        return out
    return ctx._cached("horizon_assigns_by_target", ctx.tree, compute)  # type: ignore[no-any-return]


def _is_prepare(ctx: FileContext, value: ast.AST) -> bool:
    return (isinstance(value, ast.Call) and call_attr(value) == "prepare"
            and ctx.is_accelerator(receiver(value)))


def _target_names(node: ast.Assign) -> set[str]:
    out: set[str] = set()
    for t in node.targets:
        for x in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
            if (d := dotted(x)) is not None:
                out.add(d)
    return out


def _lambda_step_horizons(ctx: FileContext) -> Iterator[tuple[str, ast.Call, ast.AST, str]]:
    """(name, constructor, horizon, its name) of a ``LambdaLR`` whose factor function reads no
    count of batches but a value named as a count of optimizer steps from outside
    (``HP["total_steps"]``, ``cfg.num_updates``), assigned to one name."""
    for node in ctx.of(ast.Assign):
        call = node.value
        if not (isinstance(call, ast.Call) and len(node.targets) == 1
                and constructor_name(call) == "LambdaLR" and lambda_horizon(ctx, call) is None):
            continue
        name = dotted(node.targets[0])
        body = lambda_body(ctx, call)
        if name is None or body is None or multiplies_by_world([body], ctx):
            continue  # (a horizon times the number of processes counts what the scheduler does)
        own = {x.arg for x in body.args.posonlyargs + body.args.args + body.args.kwonlyargs}
        for n in walk_all(body):
            key = _step_count_name(n)
            base = (dotted(n.value) if isinstance(n, ast.Subscript) else dotted(n)) or ""
            if key is not None and base.split(".", 1)[0] not in own:
                yield name, call, n, key
                break


def _step_count_name(n: ast.AST) -> str | None:
    """The name (or the string key of a subscript) of ``n`` when it names a count of optimizer
    steps (``total_steps``, ``HP["num_updates"]``)."""
    key: str
    if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) \
            and isinstance(n.slice.value, str) and dotted(n.value) is not None:
        key = n.slice.value
    elif isinstance(n, ast.Name | ast.Attribute) and isinstance(n.ctx, ast.Load) \
            and (d := dotted(n)) is not None:
        key = d.rsplit(".", 1)[-1]
    else:
        return None
    low = key.lower()
    return ast.unparse(n) if _OPT_STEPS_RE.search(low) and "warm" not in low else None


def _prepared_in_scope(ctx: FileContext, name: str, ctor: ast.AST) -> bool:
    """The function that builds the scheduler hands it to ``accelerator.prepare`` (a
    reference scheduler of the same name elsewhere is not the prepared one)."""
    scope = ctx.scope_of(ctor)
    return any(isinstance(c, ast.Call) and call_attr(c) in ("prepare", "prepare_scheduler")
               and ctx.is_accelerator(receiver(c)) and any(dotted(a) == name for a in c.args)
               for c in walk_all(scope))


@rule("AG125")
def accelerate_horizon_per_process(ctx: FileContext) -> Iterator[Finding]:
    for name, ctor, _, read in _lambda_step_horizons(ctx):
        if not (_accelerate_prepares(ctx, name) and _scales_by_world(ctx)
                and _prepared_in_scope(ctx, name, ctor)):
            continue
        yield replace(ctx.finding(
            "AG125",
            ctor,
            f"the LambdaLR factor reads `{read}`, a count of optimizer steps, as its horizon, "
            "and the file runs on several processes (it scales a count by the number of "
            f"processes), but the Accelerate-prepared `{name}` advances num_processes times per "
            "optimizer step: on W processes the schedule ends W times early and the rest of "
            "training runs at its final learning rate",
        ), severity=Severity.WARNING, confidence=Confidence.MEDIUM)
    for name, ctor, horizon in schedulers(ctx):
        if _times_world_at_use(ctx, horizon):
            continue  # `s / (updates * accelerator.num_processes)`: counted in scheduler steps
        parts = expand(ctx, horizon)
        # (divided by W, or by a product holding it: `len(dl) // (num_processes * K)`)
        per_process = next((p for p in parts if any(is_world(f) or ctx.mentions_world(f)
                                                    for d in divides([p])
                                                    for f in mult_factors(d))), None)
        if per_process is None:
            named = _optimizer_step_horizon(ctx, name, parts)
            if named is not None:
                yield replace(ctx.finding(
                    "AG125",
                    ctor,
                    f"the horizon `{ast.unparse(horizon)}` counts optimizer steps (`{named}`), "
                    "and the file runs on several processes (it scales a count by the number of "
                    f"processes), but the Accelerate-prepared `{name}` advances num_processes "
                    "times per optimizer step: on W processes the schedule ends W times early "
                    "and the rest of training runs at its final learning rate",
                ), severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                continue
            # one process's optimizer steps counted from the prepared loader's length
            length = _prepared_len(ctx, parts)
            if length is None or not (any(ctx.mentions_accum(d) for d in divides(parts))
                                      or _accelerate_k_is_one(ctx) and not divides(parts)):
                continue  # with K > 1 and no /K the horizon is off by K / W: not decidable
            if multiplies_by_world(parts, ctx) or not _accelerate_prepares(ctx, name):
                continue
            yield ctx.finding(
                "AG125",
                ctor,
                f"the horizon `{ast.unparse(horizon)}` counts optimizer steps from "
                f"`{ast.unparse(length)}` (line {length.lineno}), read after `accelerator.prepare` "
                "split that loader across the processes: it is one process's optimizer steps, but "
                f"the Accelerate-prepared `{name}` advances num_processes times per optimizer step: "
                "the schedule ends W times early and the rest of training runs at its final "
                "learning rate",
            )
            continue
        if multiplies_by_world(parts, ctx) or not _accelerate_prepares(ctx, name):
            continue
        via = "" if per_process is horizon else f", from `{ast.unparse(per_process)}`"
        yield ctx.finding(
            "AG125",
            ctor,
            f"the horizon `{ast.unparse(horizon)}`{via} is divided by the number of processes (one "
            f"process's optimizer steps), but the Accelerate-prepared `{name}` advances "
            "num_processes times per optimizer step: the schedule ends W times early and the "
            "rest of training runs at its final learning rate",
        )


def _times_world_at_use(ctx: FileContext, horizon: ast.AST) -> bool:
    """Where the schedule reads the horizon (a LambdaLR factor's ``s / (updates *
    accelerator.num_processes)``), it multiplies it by the number of processes."""
    parent = ctx.parents.get(horizon)
    if not (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult)):
        return False
    other = parent.right if parent.left is horizon else parent.left
    return is_world(other) or ctx.mentions_world(other)


#: a horizon named as a count of optimizer steps (updates), not of batches or scheduler steps
_OPT_STEPS_RE = re.compile(r"(^|_)(updates?|opt(imizer)?_?steps|train(ing)?_steps|max_steps|"
                           r"total_steps|num_steps|n_steps|steps)$")


def _optimizer_step_horizon(ctx: FileContext, name: str, parts: list[ast.AST]) -> str | None:
    """The name of a horizon counted in optimizer steps (``num_training_steps=args.num_updates``,
    no ``len()``, no division, no ``* num_processes``) of a scheduler that the file's
    Accelerator prepares, in a file that scales some count by the number of processes (it is
    written for several): None otherwise."""
    if len_args(parts) or divides(parts) or multiplies_by_world(parts, ctx) \
            or not _accelerate_prepares(ctx, name) or not _scales_by_world(ctx):
        return None
    for part in parts:  # the horizon, then what its names were assigned from
        for n in walk_all(part):
            d = dotted(n) if isinstance(n, ast.Name | ast.Attribute) else None
            if d is not None and _OPT_STEPS_RE.search(d.rsplit(".", 1)[-1].lower()):
                return d
            if isinstance(n, ast.Subscript) and (key := _step_count_name(n)) is not None:
                return key  # CONFIG["updates"]
    return None


def _scales_by_world(ctx: FileContext) -> bool:
    """Something in the file is multiplied by the number of processes, by name or through a
    name assigned from it (``W = accelerator.num_processes``; a global batch, a data size):
    the script is written for several processes."""
    return bool(ctx._cached("horizon_scales_by_world", ctx.tree,
                            lambda: multiplies_by_world([ctx.tree], ctx)))


def _split_batches(ctx: FileContext) -> ast.Call | None:
    """The ``Accelerator(...)`` of the file (the only one) built with
    ``dataloader_config=DataLoaderConfiguration(split_batches=True)`` (the call, or a name
    bound once to it). ``Accelerator(split_batches=True)`` is not it: accelerate 1.15 takes
    the keyword and ignores it."""
    accs = [c for c in calls_by_attr(ctx).get("Accelerator", []) if constructor_name(c) == "Accelerator"]
    if len(accs) != 1:
        return None
    cfg: ast.AST | None = next((k.value for k in accs[0].keywords if k.arg == "dataloader_config"), None)
    if isinstance(cfg, ast.Name):
        values = ctx.values_by_name().get(cfg.id, [])
        cfg = values[0] if len(values) == 1 else None
    if isinstance(cfg, ast.Call) and (dotted(cfg.func) or "").endswith("DataLoaderConfiguration") \
            and any(k.arg == "split_batches" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in cfg.keywords):
        return accs[0]
    return None


@rule("AG360")
def split_batches_horizon_times_processes(ctx: FileContext) -> Iterator[Finding]:
    """AG360 (F4): a scheduler prepared by an Accelerator whose loaders split each batch across
    the processes (``DataLoaderConfiguration(split_batches=True)``) with a horizon multiplied
    by the number of processes: under ``split_batches`` the prepared scheduler steps once per
    optimizer step, not ``num_processes`` times, so the schedule is W x long."""
    acc = _split_batches(ctx)
    if acc is None:
        return
    for name, ctor, horizon in schedulers(ctx):
        prepared = any(ctx.is_accelerator(receiver(c)) and any(dotted(a) == name for a in c.args)
                       for c in calls_by_attr(ctx).get("prepare", []))
        if not prepared:
            continue
        times = [f for p in [horizon] for n in walk_all(p)
                 if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                 for f in mult_factors(n) if is_world(f)]
        if not times:
            continue
        yield ctx.finding(
            "AG360",
            ctor,
            f"the horizon `{ast.unparse(horizon)}` is multiplied by "
            f"`{ast.unparse(times[0])}`, the step count Accelerate's prepared scheduler needs "
            "when it advances num_processes times per optimizer step; but this Accelerator "
            f"(line {acc.lineno}) splits each batch across the processes "
            "(DataLoaderConfiguration(split_batches=True)), and then the prepared scheduler "
            "advances once per optimizer step: the schedule is W x long and the learning rate "
            "never gets past 1/W of its way",
        )
