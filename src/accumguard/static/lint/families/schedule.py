"""Schedule rules (F4): the learning-rate schedule advancing faster than the optimizer.

AG103: the scheduler stepped on every micro-step of an accumulation window.
AG114: the scheduler stepped once per process (``for _ in range(num_processes)``)
per optimizer step: the schedule runs W times ahead.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule


@rule("AG103")
def scheduler_every_micro_step(ctx: FileContext) -> Iterator[Finding]:
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.accumulating or facts.unguarded_optimizer_steps or facts.accelerate or facts.summed_loss:
            continue
        for call, kind in facts.steps:
            if kind != "scheduler" or ctx.guarded(call, window):
                continue
            name = dotted(receiver(call)) or "scheduler"
            yield ctx.finding(
                "AG103",
                call,
                f"`{name}.step()` runs on every micro-batch: the learning-rate schedule advances K "
                "times per optimizer step",
            )


@rule("AG114")
def scheduler_per_process(ctx: FileContext) -> Iterator[Finding]:
    for loop in ctx.of(ast.For, ast.AsyncFor):
        if not isinstance(loop.iter, ast.Call) or call_attr(loop.iter) != "range" or not loop.iter.args:
            continue
        args = loop.iter.args
        if len(args) > 2 or (len(args) == 2 and not (isinstance(args[0], ast.Constant) and args[0].value == 0)):
            continue  # range(start, stop): not "once per process"
        if not ctx.mentions_world(loop.iter.args[-1]):
            continue
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
