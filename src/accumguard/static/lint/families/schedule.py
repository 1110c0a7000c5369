"""Schedule rules (F4): the learning-rate schedule advancing faster than the optimizer.

AG103: the scheduler stepped on every micro-step of an accumulation window.
AG114: the scheduler stepped once per process (``for _ in range(num_processes)``)
per optimizer step: the schedule runs W times ahead.
AG119: the scheduler stepped in a framework hook that runs on every micro-batch: Hugging
Face ``TrainerCallback.on_substep_end`` (called only between the micro-batches of a
window, so stepping there is wrong for any GA), or Lightning's ``on_train_batch_end`` /
``on_after_backward`` / ``on_before_backward`` when the file sets
``accumulate_grad_batches`` above 1 and never to 1; the same for a ``LightningModule``'s
own ``training_step`` under automatic optimisation (Lightning runs it on every batch and
steps the optimizer every K-th; a module that sets ``automatic_optimization = False``
gates its own steps). A boundary test around the call
(``if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:``) is respected.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, WORLD_RE, call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._ctx_batch import whole_window_iteration
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lightning import (
    LIGHTNING_PER_BATCH,
    automatic_lightning_module,
    lightning_accumulates,
)


def _accelerator_k(ctx: FileContext) -> int | None:
    """The ``gradient_accumulation_steps`` every ``Accelerator(...)`` of the file is given, when
    it is one integer in sight (None otherwise)."""
    def compute() -> int | None:
        values = {ctx.int_value(k.value) for c in ctx.of(ast.Call) if call_attr(c) == "Accelerator"
                  for k in c.keywords if k.arg == "gradient_accumulation_steps"}
        return values.pop() if len(values) == 1 else None
    return ctx._cached("accelerator_k", ctx.tree, compute)  # type: ignore[no-any-return]


def _accelerator_k_expr(ctx: FileContext) -> ast.AST | None:
    """The one expression every ``Accelerator(...)`` of the file is given as
    ``gradient_accumulation_steps`` (its value may be out of sight), else None."""
    def compute() -> ast.AST | None:
        exprs = [k.value for c in ctx.of(ast.Call) if call_attr(c) == "Accelerator"
                 for k in c.keywords if k.arg == "gradient_accumulation_steps"]
        return exprs[0] if len({ast.dump(e) for e in exprs}) == 1 else None
    return ctx._cached("accelerator_k_expr", ctx.tree, compute)  # type: ignore[no-any-return]


def _prepared_names(ctx: FileContext) -> set[str] | None:
    """What ``accelerator.prepare(...)`` receives or returns (dotted names); None when the file
    calls no ``prepare`` or hands it a ``*spread`` (what is prepared cannot be told)."""
    def compute() -> set[str] | None:
        calls = [c for c in ctx.of(ast.Call) if call_attr(c) == "prepare" and c.args]
        if not calls or any(isinstance(a, ast.Starred) for c in calls for a in c.args):
            return None
        out = {d for c in calls for a in c.args if (d := dotted(a)) is not None}
        for c in calls:
            parent = ctx.parents.get(c)
            if isinstance(parent, ast.Assign):
                out |= {d for t in parent.targets for x in walk_all(t) if (d := dotted(x)) is not None}
        return out
    return ctx._cached("prepared_names", ctx.tree, compute)  # type: ignore[no-any-return]


def _scheduler_ungated(ctx: FileContext) -> bool:
    """An ``Accelerator(step_scheduler_with_optimizer=False)`` of the file: its prepared
    schedulers step whenever called, not only with the optimizer."""
    return any((dotted(c.func) or "").rsplit(".", 1)[-1] == "Accelerator" and any(
        k.arg == "step_scheduler_with_optimizer" and isinstance(k.value, ast.Constant)
        and k.value.value is False for k in c.keywords) for c in ctx.of(ast.Call))


def _unprepared_scheduler_steps(ctx: FileContext, window: ast.AST) -> Iterator[Finding]:
    """Inside ``accelerator.accumulate(...)`` Accelerate gates the *prepared* scheduler's step;
    a scheduler built in the file and never handed to ``prepare`` steps on every micro-batch,
    and so does a prepared one under ``step_scheduler_with_optimizer=False``."""
    k = _accelerator_k(ctx)
    prepared = _prepared_names(ctx)
    expr = _accelerator_k_expr(ctx) if k is None else None
    if prepared is None or (k is not None and k < 2) or (
            k is None and (expr is None or isinstance(expr, ast.Constant))):
        return
    shown = str(k) if k is not None else f"`{ast.unparse(expr)}`" if expr is not None else "?"
    ungated = _scheduler_ungated(ctx)
    for call, kind in ctx.window_facts(window).steps:
        name = dotted(receiver(call))
        if kind != "scheduler" or name is None or (name in prepared and not ungated) \
                or name not in ctx.schedulers or ctx.guarded(call, window):
            continue
        why = (f"`{name}` was handed to `accelerator.prepare`, but the Accelerator was built "
               "with `step_scheduler_with_optimizer=False`, so the prepared scheduler steps on "
               "every call" if name in prepared else
               f"`{name}` was never handed to `accelerator.prepare`, so Accelerate does not "
               "gate its step")
        finding = ctx.finding(
            "AG103",
            call,
            f"`{name}.step()` runs on every micro-batch: {why} under `accumulate()` "
            f"(gradient_accumulation_steps = {shown}): the learning-rate schedule advances K "
            "times per optimizer step; "
            + ("step it under `if accelerator.sync_gradients:`" if name in prepared else
               "prepare it, or step it under `if accelerator.sync_gradients:`")
            + ("" if k is not None else " (K is not in sight: with K = 1 this is right)"),
        )
        yield finding if k is not None else replace(
            finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)


def _micro_counters(ctx: FileContext, window: ast.AST) -> set[str]:
    """The names that count the window's micro-batches: ``i`` of ``for i, b in enumerate(...)``
    (or ``for i in range(...)``) and a name the loop body increments on every micro-batch
    (``micro += 1`` not behind a boundary test or an ``if <boundary>: continue``)."""
    out: set[str] = set()
    if isinstance(window, ast.For | ast.AsyncFor):
        target, it = window.target, window.iter
        if isinstance(it, ast.Call) and call_attr(it) == "enumerate" and isinstance(target, ast.Tuple) \
                and target.elts and isinstance(target.elts[0], ast.Name):
            out.add(target.elts[0].id)
        elif isinstance(it, ast.Call) and call_attr(it) == "range" and isinstance(target, ast.Name):
            out.add(target.id)
    for stmt in getattr(window, "body", []):
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name) \
                and not ctx.guarded(stmt, window):
            out.add(stmt.target.id)
    return out


def _step_update_by_micro_counter(ctx: FileContext, window: ast.AST) -> Iterator[Finding]:
    """timm's ``lr_scheduler.step_update(num_updates=n)`` sets the learning rate for update
    ``n``: called with the loop's micro-batch counter, the schedule runs K times fast."""
    counters = _micro_counters(ctx, window)
    if not counters:
        return
    for n in ctx.local_nodes(window):
        if not (isinstance(n, ast.Call) and call_attr(n) == "step_update"
                and ctx.kind_of_receiver(receiver(n)) == "scheduler"):
            continue
        arg = next((k.value for k in n.keywords if k.arg == "num_updates"), n.args[0] if n.args else None)
        if isinstance(arg, ast.Name) and arg.id in counters:
            yield ctx.finding(
                "AG103",
                n,
                f"`{ast.unparse(n.func)}(...)` is given `{arg.id}`, which counts micro-batches: the "
                "scheduler sets the learning rate of update number `" + arg.id + "`, so the schedule "
                "runs K times fast; pass the number of optimizer steps taken",
            )


def _ds_ga_out_of_sight(ctx: FileContext) -> str | None:
    """The DeepSpeed config's ``gradient_accumulation_steps`` when the config dict is in
    sight but that value is not (``hp["grad_accum"]`` of a function's argument) and it names
    the accumulation count: its source text; else None."""
    ref = ctx.ds_config()
    node = getattr(ref, "node", None) if ref is not None else None
    if ref is None or ref.ga is not None or not isinstance(node, ast.Dict):
        return None
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == "gradient_accumulation_steps":
            text = ast.unparse(value)
            return text if ctx.mentions_accum(value) or "accum" in text.lower() else None
    return None


def _ds_client_scheduler_steps(ctx: FileContext, window: ast.AST) -> Iterator[Finding]:
    """An engine loop (``engine.backward`` then an unguarded ``engine.step()`` every
    micro-batch, as DeepSpeed wants) that also steps a scheduler of its own on every
    micro-batch, while the config's GA is out of sight: a warning (AG103 proper when GA > 1
    is in sight)."""
    ga = _ds_ga_out_of_sight(ctx)
    facts = ctx.window_facts(window)
    if ga is None or not facts.engine_backward or not facts.engine_steps_unguarded:
        return
    for call, kind in facts.steps:
        if kind != "scheduler" or ctx.guarded(call, window):
            continue
        name = dotted(receiver(call)) or "scheduler"
        finding = ctx.finding(
            "AG103",
            call,
            f"`{name}.step()`{ctx.via_text(call, window)} runs after every `engine.step()`, on "
            "every micro-batch, but the DeepSpeed engine steps its optimizer once per "
            f"gradient_accumulation_steps calls (`{ga}` in the config, its value out of sight): "
            "with GA > 1 the learning-rate schedule advances K times per optimizer step; step it "
            "under `if engine.is_gradient_accumulation_boundary():` (read before "
            "`engine.step()`), or hand it to `deepspeed.initialize(lr_scheduler=...)`",
        )
        yield replace(finding, severity=Severity.WARNING, confidence=Confidence.MEDIUM)


@rule("AG103")
def scheduler_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating and facts.engine_backward:
            yield from _ds_client_scheduler_steps(ctx, window)
        if facts.accelerate and facts.accumulating and not facts.summed_loss:
            yield from _unprepared_scheduler_steps(ctx, window)
        if facts.accumulating and not facts.unguarded_optimizer_steps and not facts.summed_loss:
            yield from _step_update_by_micro_counter(ctx, window)
        if not facts.accumulating and not facts.engine_backward and not facts.accelerate:
            yield from _scheduler_beside_k_gated_step(ctx, window, facts.steps)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.accelerate or facts.summed_loss:
            continue
        for call, kind in facts.steps:
            if kind != "scheduler" or ctx.guarded(call, window) or _positioned(ctx, call):
                continue
            name = dotted(receiver(call)) or "scheduler"
            yield ctx.finding(
                "AG103",
                call,
                f"`{name}.step()`{ctx.via_text(call, window)} runs on every micro-batch: the "
                "learning-rate schedule advances K "
                "times per optimizer step",
            )


def _scheduler_beside_k_gated_step(ctx: FileContext, window: ast.AST,
                                   steps: list[tuple[ast.Call, str]]) -> Iterator[Finding]:
    """A window whose gradients are all made at the boundary (GradCache-style: the cached
    micro-batches' backwards run inside ``if (batch_idx + 1) % K == 0:``), so it does not
    accumulate across calls, but whose every optimizer step is under that K gate while a
    scheduler step is not: the schedule still advances once per micro-batch, K times per
    optimizer step."""
    opt = [c for c, k in steps if k == "optimizer"]
    if not opt or not all(_k_gate(ctx, c, window) for c in opt):
        return
    for call, kind in steps:
        if kind != "scheduler" or ctx.guarded(call, window) or _positioned(ctx, call):
            continue
        gate = _k_gate(ctx, opt[0], window)
        name = dotted(receiver(call)) or "scheduler"
        yield ctx.finding(
            "AG103", call,
            f"`{name}.step()` runs on every call of this loop body while the optimizer steps "
            f"only under `if {ast.unparse(gate.test) if gate is not None else 'K'}:` (line "
            f"{opt[0].lineno}), once per K micro-batches: the learning-rate schedule advances K "
            "times per optimizer step")


def _positioned(ctx: FileContext, call: ast.Call) -> bool:
    """``scheduler.step(epoch + i / n)``: given its position, the schedule is where the
    script puts it whatever the number of calls (torch's documented use of
    CosineAnnealingWarmRestarts per batch). Not a ``ReduceLROnPlateau`` (its argument is a
    metric, and its calls count)."""
    if not (call.args or any(k.arg == "epoch" for k in call.keywords)):
        return False
    name = dotted(receiver(call))
    made = ctx.values_by_name().get(name, []) if name else []
    return not any(isinstance(v, ast.Call) and (dotted(v.func) or "").endswith("ReduceLROnPlateau")
                   for v in made)


def _k_gate(ctx: FileContext, call: ast.AST, window: ast.AST) -> ast.If | None:
    """The ``if`` between ``call`` and ``window`` whose test is a modulus by the accumulation
    count (``(batch_idx + 1) % K == 0``)."""
    cur = ctx.parents.get(call)
    while cur is not None and cur is not window:
        if isinstance(cur, ast.If) and any(
                isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and ctx.mentions_accum(n.right)
                for n in walk_all(cur.test)):
            return cur
        cur = ctx.parents.get(cur)
    return None


def _is_world(ctx: FileContext, stop: ast.AST) -> bool:
    """``stop`` is the world size itself (``world``, ``args.world_size``,
    ``dist.get_world_size()``, ``accelerator.num_processes``), not a value computed from
    it (``steps_per_epoch(cfg, world)``, ``n // world``: a count of windows)."""
    if isinstance(stop, ast.Call):
        return bool(WORLD_RE.search((call_attr(stop) or "").lower())) and not stop.args
    return isinstance(stop, ast.Name | ast.Attribute) and ctx.mentions_world(stop)


@rule("AG114")
def scheduler_per_process(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For, ast.AsyncFor):
        if not isinstance(loop.iter, ast.Call) or call_attr(loop.iter) != "range" or not loop.iter.args:
            continue
        args = loop.iter.args
        if len(args) > 2 or (len(args) == 2 and not (isinstance(args[0], ast.Constant) and args[0].value == 0)):
            continue  # range(start, stop): not "once per process"
        if not _is_world(ctx, loop.iter.args[-1]):
            continue
        outer = ctx.enclosing(loop, (ast.For, ast.AsyncFor))
        if outer is not None and whole_window_iteration(ctx, outer):
            continue  # one process stepping for the W it stands for (a large-batch reference)
        for stmt in loop.body:
            for sub in walk_all(stmt):
                if (
                    isinstance(sub, ast.Call)
                    and call_attr(sub) == "step"
                    and ctx.kind_of_receiver(receiver(sub)) == "scheduler"
                ):
                    name = dotted(receiver(sub)) or "scheduler"
                    yield ctx.finding(
                        "AG114",
                        sub,
                        f"`{name}.step()` runs once per process (loop over "
                        f"`{ast.unparse(loop.iter)}`) for each optimizer step: every rank already "
                        "steps its own scheduler, so the schedule runs W times ahead",
                    )


# HF calls on_substep_end after every micro-batch but the last of a window
_HF_SUBSTEP = "on_substep_end"


def _is_scheduler(ctx: FileContext, recv: ast.AST | None) -> bool:
    """A scheduler by what the file knows of it, or ``kwargs["lr_scheduler"]``,
    ``self.lr_schedulers()`` (Lightning), ``trainer.lr_scheduler_configs[0].scheduler``."""
    if isinstance(recv, ast.Subscript) and isinstance(recv.slice, ast.Constant) and isinstance(recv.slice.value, str):
        return "sched" in recv.slice.value
    if isinstance(recv, ast.Attribute) and dotted(recv) is None:
        return "sched" in recv.attr.lower()  # trainer.lr_scheduler_configs[0].scheduler
    if isinstance(recv, ast.Call):
        attr = call_attr(recv)
        if attr == "lr_schedulers":
            return True
        first = recv.args[0] if recv.args else None
        return attr in ("get", "pop") and isinstance(first, ast.Constant) and "sched" in str(first.value)
    return ctx.kind_of_receiver(recv) == "scheduler"


@rule("AG119")
def scheduler_in_micro_step_hook(ctx: FileContext) -> Iterator[Finding]:
    lightning: bool | None = None
    for func in ctx.of(*FUNCS):
        if ctx.enclosing(func, (ast.ClassDef,)) is None:
            continue  # a hook is a method
        if func.name == _HF_SUBSTEP:
            where = "Hugging Face calls `on_substep_end` after every micro-batch of a window but the last"
        elif func.name in LIGHTNING_PER_BATCH:
            if lightning is None:
                lightning = lightning_accumulates(ctx)
            if not lightning:
                continue
            where = (f"Lightning calls `{func.name}` on every batch, and accumulate_grad_batches > 1 "
                     "makes K batches one optimizer step")
        elif func.name == "training_step" and automatic_lightning_module(ctx, func):
            if lightning is None:
                lightning = lightning_accumulates(ctx)
            if not lightning:
                continue
            where = ("under automatic optimisation Lightning runs `training_step` on every batch and "
                     "steps the optimizer once per accumulate_grad_batches (> 1) batches; "
                     "configure_optimizers' lr_scheduler (interval='step') is stepped at the boundary")
        else:
            continue
        for n in ctx.local_nodes(func):
            if not (isinstance(n, ast.Call) and call_attr(n) == "step" and _is_scheduler(ctx, receiver(n))):
                continue
            if ctx.guarded(n, func):
                continue  # stepped only at a boundary the hook tests itself
            name = ast.unparse(receiver(n) or n.func)
            yield ctx.finding(
                "AG119",
                n,
                f"`{name}.step()` in `{func.name}`: {where}, so the learning-rate schedule advances "
                "per micro-batch instead of once per optimizer step",
            )
