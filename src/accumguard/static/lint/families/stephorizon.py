"""AG198 (F4): a horizon already counted in optimizer steps, multiplied by K; AG339 (F4):
the same count divided by K.

The ``num_training_steps`` the HF Trainer passes to ``create_scheduler`` (and
``create_optimizer_and_scheduler``) counts optimizer steps already (Lightning's
``estimated_stepping_batches`` times K is AG124's, in :mod:`._lghorizon`).
A schedule sized ``num_training_steps * gradient_accumulation_steps`` is K times longer than
the run: it is stepped once per optimizer step, so a cosine ends at 1/K of its way and a
warm-up lasts K times its length. Judged where the schedule's horizon (as the horizon
rules read it, through the names it is built from) is a product of such a count and a
name holding K: an error when K > 1 is in sight, a warning when it is not, silent for K = 1.

AG339 is the other way round: Lightning's ``self.trainer.estimated_stepping_batches`` (the
optimizer steps of the whole fit: it counts ``accumulate_grad_batches`` and the devices) or
the Trainer hooks' ``num_training_steps``, divided by K (``//``, ``/``, inside
``math.ceil``) as if it counted batches. The schedule then ends after 1/K of the run and the
rest trains at its final rate. Read in a scheduler's horizon argument, or in a name the
``LambdaLR`` function reads from outside.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, dotted, mult_factors
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._horizonexpr import (
    constructor_name,
    expand,
    horizon_expr,
    lambda_body,
    schedulers,
)

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


def _stepping_batches(node: ast.AST) -> bool:
    """``<...>.estimated_stepping_batches``: Lightning's optimizer steps of the whole fit."""
    return isinstance(node, ast.Attribute) and node.attr == "estimated_stepping_batches"


def _horizon_names(ctx: FileContext, call: ast.Call) -> list[ast.AST]:
    """What sizes the schedule ``call`` builds: its horizon argument, or the names a
    ``LambdaLR`` function reads from outside."""
    horizon = horizon_expr(ctx, call)
    if horizon is not None:
        return [horizon]
    if constructor_name(call) != "LambdaLR":
        return []
    body = lambda_body(ctx, call)
    if body is None:
        return []
    own = {a.arg for a in (*body.args.posonlyargs, *body.args.args, *body.args.kwonlyargs)}
    return [n for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and n.id not in own]


_SCHEDULE_CTORS = frozenset({
    "LambdaLR", "CosineAnnealingLR", "LinearLR", "PolynomialLR", "OneCycleLR",
    "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup", "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_wsd_schedule",
})


def _lightning_k_one(ctx: FileContext) -> bool:
    """Every ``Trainer(...)`` of the file leaves ``accumulate_grad_batches`` at 1 (unset, or
    the literal 1): dividing by it changes nothing."""
    trainers = [c for c in ctx.of(ast.Call) if (dotted(c.func) or "").endswith("Trainer")]
    return bool(trainers) and all(
        all(k.arg != "accumulate_grad_batches" or (
            isinstance(k.value, ast.Constant) and k.value.value == 1) for k in c.keywords)
        and not any(k.arg is None for k in c.keywords) for c in trainers)


@rule("AG339")
def optimizer_step_horizon_over_k(ctx: FileContext) -> Iterator[Finding]:
    if _lightning_k_one(ctx):
        return
    for call in ctx.of(ast.Call):
        if constructor_name(call) not in _SCHEDULE_CTORS:
            continue
        for horizon in _horizon_names(ctx, call):
            hit = next((
                (div, counted) for part in expand(ctx, horizon) for div in ast.walk(part)
                if isinstance(div, ast.BinOp) and isinstance(div.op, ast.Div | ast.FloorDiv)
                and ctx.mentions_accum(div.right)
                and (counted := next((
                    ast.unparse(n) for n in ast.walk(div.left)
                    if _stepping_batches(n) or _optimizer_steps(ctx, n, call)), None))), None)
            if hit is None:
                continue
            div, counted = hit
            yield ctx.finding(
                "AG339", call,
                f"the schedule's horizon `{ast.unparse(div)}` divides `{counted}`, which "
                "already counts optimizer steps (accumulation included), by K: the schedule "
                "ends after 1/K of the run and the rest trains at its final learning rate")
            break
