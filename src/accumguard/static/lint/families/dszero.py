"""``engine.zero_grad()`` on every micro-batch of a ZeRO-0/1 run that accumulates (F3): AG310.

DeepSpeed's own loop calls ``engine.backward(loss)`` and ``engine.step()`` on every
micro-batch and lets ``gradient_accumulation_steps`` decide the boundary. ZeRO stages 0 and 1
keep the window's gradient in the parameters' ``.grad`` until that boundary, and
``engine.zero_grad()`` sets every ``.grad`` to None: called in the same unguarded sequence as
the backward and the step, it erases the micro-batches before it, and the optimizer steps on
the window's last one only (measured; under ZeRO-2/3 the gradient lives in the engine's
partitions and the same call changes nothing, so those stages are not reported).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Finding, Severity
from accumguard.static.lint._ast import dotted, receiver
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families.deepspeed import engine_ga_above_one


def _seq_calls(body: list[ast.stmt]) -> list[tuple[str, str | None, ast.Call]]:
    """(method, receiver, call) of the plain statements of a body, in order (not inside an
    ``if``, a loop or a ``with``: those are gated or another block)."""
    out = []
    for st in body:
        if isinstance(st, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Return):
            for n in ast.walk(st):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                    out.append((n.func.attr, dotted(receiver(n)), n))
    return out


def _field_default_stage(ctx: FileContext, ref: object) -> int | None:
    """The ZeRO stage of a config dict whose ``"stage"`` is a field of a config object
    (``{"stage": cfg.zero_stage}``): the one literal default of a class field so named."""
    node = getattr(ref, "node", None)
    if not isinstance(node, ast.Dict):
        return None
    value = next((v for k, v in zip(node.keys, node.values, strict=True)
                  if isinstance(k, ast.Constant) and k.value == "zero_optimization"), None)
    if not isinstance(value, ast.Dict):
        return None
    stage = next((v for k, v in zip(value.keys, value.values, strict=True)
                  if isinstance(k, ast.Constant) and k.value == "stage"), None)
    if not isinstance(stage, ast.Attribute):
        return None
    found = {st.value.value for c in ctx.of(ast.ClassDef) if isinstance(c, ast.ClassDef)
             for st in c.body if isinstance(st, ast.AnnAssign)
             and isinstance(st.target, ast.Name) and st.target.id == stage.attr
             and isinstance(st.value, ast.Constant) and isinstance(st.value.value, int)}
    return found.pop() if len(found) == 1 else None


@rule("AG310")
def engine_zero_grad_every_micro_batch(ctx: FileContext) -> Iterator[Finding]:
    engines = ctx.engines
    ref = ctx.ds_config()
    if not engines or ref is None or ref.managed is False or not engine_ga_above_one(ctx):
        return
    stage, sure = ref.stage, True
    if stage is None:
        stage, sure = _field_default_stage(ctx, ref), False  # (a default the run may change)
    if stage not in (0, 1):
        return
    bodies = [n.body for n in ast.walk(ctx.tree)
              if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.For | ast.While)]
    for body in bodies:
        calls = _seq_calls(body)
        for i, (name, recv, call) in enumerate(calls):
            if name != "zero_grad" or recv not in engines:
                continue
            names = [m for m, r, _ in calls[i + 1:] if r == recv]
            if "backward" in names and "step" in names:
                finding = ctx.finding(
                    "AG310", call,
                    f"`{recv}.zero_grad()` runs with `{recv}.backward()` and `{recv}.step()` "
                    f"on every micro-batch while ZeRO-{stage} accumulates "
                    "gradient_accumulation_steps micro-batches in the parameters' .grad: it "
                    "sets them to None before each backward, so only the window's last "
                    "micro-batch reaches the optimizer"
                    + ("" if sure else f" (ZeRO-{stage} is the default of the config field "
                       "the stage is read from)"))
                yield finding if sure else replace(finding, severity=Severity.WARNING)
                break
