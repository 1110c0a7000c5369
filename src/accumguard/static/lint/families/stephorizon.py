"""AG198 (F4): a horizon already counted in optimizer steps, multiplied by K.

The ``num_training_steps`` the HF Trainer passes to ``create_scheduler`` (and
``create_optimizer_and_scheduler``) counts optimizer steps already (Lightning's
``estimated_stepping_batches`` times K is AG124's, in :mod:`._lghorizon`).
A schedule sized ``num_training_steps * gradient_accumulation_steps`` is K times longer than
the run: it is stepped once per optimizer step, so a cosine ends at 1/K of its way and a
warm-up lasts K times its length. Judged where the schedule's horizon (as the horizon
rules read it, through the names it is built from) is a product of such a count and a
name holding K: an error when K > 1 is in sight, a warning when it is not, silent for K = 1.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, dotted, mult_factors
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import expand, schedulers

#: hooks whose ``num_training_steps`` parameter the HF Trainer fills with optimizer steps
_HF_HOOKS = ("create_scheduler", "create_optimizer_and_scheduler")


def _optimizer_steps(ctx: FileContext, node: ast.AST, ctor: ast.AST) -> str | None:
    """What ``node`` is, when it is a count of optimizer steps the HF Trainer gave: its
    hook's ``num_training_steps`` parameter (the constructor inside that hook)."""
    if isinstance(node, ast.Name) and node.id == "num_training_steps":
        fn = ctx.enclosing(ctor, FUNCS)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name in _HF_HOOKS \
                and any(a.arg == "num_training_steps" for a in fn.args.args):
            return (f"the `num_training_steps` the HF Trainer passes to `{fn.name}` "
                    "(optimizer steps)")
    return None


@rule("AG198")
def optimizer_step_horizon_times_k(ctx: FileContext) -> Iterator[Finding]:
    for name, ctor, horizon in schedulers(ctx):
        for part in expand(ctx, horizon):
            factors = mult_factors(part)
            if len(factors) < 2:
                continue
            counted = next((w for f in factors if (w := _optimizer_steps(ctx, f, ctor))), None)
            k = next((f for f in factors if ctx.mentions_accum(f)), None)
            if counted is None or k is None:
                continue
            ks = {ctx.trainer_ga()[0]} if (dotted(k) or "").endswith(
                "gradient_accumulation_steps") else ctx.int_candidates(k)
            known = {v for v in ks if v is not None}
            if known and None not in ks and max(known) < 2:
                continue  # K = 1: nothing is multiplied
            finding = ctx.finding(
                "AG198", ctor,
                f"the horizon of `{name}` is `{ast.unparse(part)}`: {counted} times "
                f"`{ast.unparse(k)}`; the scheduler is stepped once per optimizer step, so "
                "the schedule is K times longer than the run (a cosine ends at 1/K of its "
                "way, a warm-up lasts K times its length)")
            if known and None not in ks:
                finding = replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH)
            yield finding  # (K not in sight: a warning, the medium confidence of the catalogue)
            break
