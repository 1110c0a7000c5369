"""A scheduler DeepSpeed steps, stepped by the script too (F4): AG153.

A scheduler handed to ``deepspeed.initialize(lr_scheduler=...)`` (and the one it returns as
its fourth value) is stepped by the engine itself, once per optimizer step, inside
``engine.step()`` at each accumulation boundary. A ``scheduler.step()`` the script also
calls advances the schedule a second time (or K times more, once per micro-batch): the
learning rate runs ahead of the optimizer steps. The script's own call is judged by the
object it names: the name given to ``initialize`` in that function, the name (or ``self``
attribute) its fourth value is assigned to; a scheduler of the same name elsewhere (a
reference run's) is another object and not reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule


def _engine_schedulers(ctx: FileContext) -> Iterator[tuple[ast.Call, str, ast.AST]]:
    """(initialize call, scheduler name, the scope the name is good in)."""
    for call in ctx.of(ast.Call):
        if call_attr(call) != "initialize" or "deepspeed" not in (dotted(call.func) or ""):
            continue
        scope = ctx.scope_of(call)
        given = next((k.value for k in call.keywords if k.arg == "lr_scheduler"), None)
        names: list[str] = []
        if given is not None and (d := dotted(given)) is not None:
            names.append(d)
        parent = ctx.parents.get(call)
        if isinstance(parent, ast.Assign) and isinstance(parent.targets[0], ast.Tuple) \
                and len(parent.targets[0].elts) == 4 and (given is not None or _config_scheduler(call)):
            fourth = dotted(parent.targets[0].elts[3])
            if fourth is not None and fourth != "_":
                names.append(fourth)
        for name in names:
            where = ctx.enclosing(call, (ast.ClassDef,)) if name.startswith("self.") else scope
            yield call, name, where or ctx.tree


def _config_scheduler(call: ast.Call) -> bool:
    """The config given to ``initialize`` is a dict literal with a ``"scheduler"`` block."""
    cfg = next((k.value for k in call.keywords if k.arg in ("config", "config_params")), None)
    return isinstance(cfg, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "scheduler" for k in cfg.keys)


@rule("AG153")
def scheduler_stepped_twice_with_deepspeed(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.deepspeed:
        return
    for init, name, scope in _engine_schedulers(ctx):
        for n in ast.walk(scope):
            if not (isinstance(n, ast.Call) and call_attr(n) == "step"
                    and dotted(receiver(n)) == name):
                continue
            if scope is not ctx.scope_of(init) or n.lineno > init.lineno:
                yield ctx.finding(
                    "AG153",
                    n,
                    f"`{name}.step()`: `{name}` is the scheduler handed to (or returned by) `deepspeed.initialize` "
                    f"(line {init.lineno}), which the engine already steps inside `engine.step()` "
                    "at each accumulation boundary, so the schedule advances twice (or more) per "
                    "optimizer step",
                )
                break
