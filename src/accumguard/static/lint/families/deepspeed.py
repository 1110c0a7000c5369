"""DeepSpeed rules: who gates the accumulation boundary, and the config written in the script.

AG109 (F2) the loop calls ``engine.step()`` once per several ``engine.backward()``
      while the config has GA 1 (or none) on ZeRO-1/2: every backward is a
      boundary and only the last micro-batch survives. Not reported on ZeRO-0/3
      (they accumulate correctly), with ``managed_gradient_accumulation: false``
      (then ``step()`` *is* the boundary, the documented fix), or when the loop
      marks the boundary itself (``coalesce_grad_reduction``,
      ``set_gradient_accumulation_boundary``, ``no_sync``).
AG110 (F14) the same hand-gated loop while the config's GA is K > 1: double gating.
AG200-AG207: a config written as a dict literal in the script gets exactly the
      checks ``accumguard check-config`` applies to a file, at the script's lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static import dsconfig
from accumguard.static.findings import Finding
from accumguard.static.lint._ast import LOOPS, call_attr, dotted, receiver, walk_local
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.registry import rule

_CONFIG_CODES = ("AG200", "AG201", "AG203", "AG204", "AG205", "AG206", "AG207")


def _hand_gated_steps(ctx: FileContext) -> Iterator[tuple[ast.AST, ast.Call]]:
    """(window, engine.step() call) where the loop decides the boundary itself: a step under
    a boundary condition, or one step after an inner loop of backwards."""
    for window in ctx.windows():
        facts = ctx.window_facts(window)
        if not facts.engine_backward:
            continue
        engine_steps = [c for c, k in facts.steps if k == "engine"]
        gated = [c for c in engine_steps if ctx.guarded(c, window)]
        if gated:
            yield window, gated[0]
            continue
        if engine_steps or not isinstance(window, LOOPS):
            continue
        outer = ctx.enclosing(window, LOOPS)
        if outer is None:
            continue
        for n in walk_local(outer):
            if (
                isinstance(n, ast.Call)
                and call_attr(n) == "step"
                and ctx.kind_of_receiver(receiver(n)) == "engine"
                and n.lineno > getattr(window, "end_lineno", window.lineno)
            ):
                yield window, n
                break


@rule("AG109", "AG110")
def engine_gating(ctx: FileContext) -> Iterator[Finding]:
    if ctx.explicit_ds_boundary:
        return
    ref = ctx.ds_config()
    if ref is None:
        return  # no config in sight: do not guess
    if ref.managed is False:
        return  # step() is the boundary: a hand-gated loop is what this mode expects
    ga = ref.ga
    for _, site in _hand_gated_steps(ctx):
        name = dotted(receiver(site)) or "engine"
        if ga is None or ga <= 1:
            stage = ref.stage
            if stage not in (1, 2):
                continue  # ZeRO-0/3 accumulate right with GA 1; unknown stage: no guess
            yield ctx.finding(
                "AG109",
                site,
                f"`{name}.step()` is called once per several `backward()` calls, but the DeepSpeed "
                f"config ({ref.where}) has gradient_accumulation_steps "
                f"{'absent' if ga is None else ga} on ZeRO-{stage}: every backward is a boundary, "
                "so the optimizer trains on the last micro-batch only",
            )
        else:
            yield ctx.finding(
                "AG110",
                site,
                f"`{name}.step()` is gated by hand while the DeepSpeed config ({ref.where}) has "
                f"gradient_accumulation_steps {ga}: the engine counts one micro-step per step() call, "
                f"so it steps every K x {ga} micro-batches, on the last micro-batch only",
            )


@rule(*_CONFIG_CODES)
def config_literal_checks(ctx: FileContext) -> Iterator[Finding]:
    """check-config's checks on each DeepSpeed config dict literal in the script."""
    for ref in ctx.ds_config_literals():
        for f in dsconfig.check_config(ref.cfg):
            if f.code == "AG203" and ref.hf:
                continue  # the HF Trainer's max_grad_norm (default 1.0) is the clipping asked for
            line = f.line or getattr(ref.node, "lineno", 1)
            yield Finding(
                code=f.code,
                severity=f.severity,
                message=f"{f.message} (DeepSpeed config {ref.where})",
                fix=f.fix,
                key=f.key,
                line=line,
                col=1 if f.line else getattr(ref.node, "col_offset", 0) + 1,
                confidence=f.confidence,
            )
