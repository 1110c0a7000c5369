"""A DeepSpeed ``train_batch_size`` written without the number of processes: AG152.

``train_batch_size`` is the global batch: micro-batch x gradient_accumulation_steps x
world size. A config that gives ``train_batch_size`` and ``train_micro_batch_size_per_gpu``
but not ``gradient_accumulation_steps`` lets DeepSpeed derive the accumulation as
``train_batch_size / (micro x W)``. Written as ``micro * K`` (the script's accumulation
count, no world size), that derivation gives K / W: on W > 1 processes every rank steps
after K / W micro-batches instead of K, the global batch is W times smaller than the loop's
accumulation says, and a schedule sized in windows of K runs W times fast. A warning: on one
process the arithmetic agrees. The same for ``engine.set_train_batch_size(micro * K)`` (a batch
ramp: DeepSpeed sets the accumulation to that value / (micro x W)). Class F1: on W > 1 ranks
the engine steps after K / W micro-batches; ``accumguard watch`` makes it an error when the run
has several ranks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import call_attr, mult_factors
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

_TBS, _MICRO, _GA = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


@rule("AG152")
def train_batch_without_world(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.deepspeed:
        return
    for d in ctx.of(ast.Dict):
        entries = {k.value: v for k, v in zip(d.keys, d.values, strict=True)
                   if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if _TBS not in entries or _MICRO not in entries or _GA in entries or None in d.keys:
            continue
        factors = mult_factors(entries[_TBS])
        micro = ast.unparse(entries[_MICRO])
        rest = [f for f in factors if ast.unparse(f) != micro]
        if len(rest) != len(factors) - 1 or len(rest) != 1:
            continue
        k = rest[0]
        if not ctx.mentions_accum(k) or ctx.mentions_world(k):
            continue
        yield ctx.finding(
            "AG152",
            entries[_TBS],
            f"`\"{_TBS}\": {ast.unparse(entries[_TBS])}` is the micro-batch times "
            f"`{ast.unparse(k)}` with no number of processes, and the config gives no "
            f"{_GA}: DeepSpeed derives it as {_TBS} / ({_MICRO} x W) = `{ast.unparse(k)}` / W, "
            f"so on W > 1 processes each rank steps after 1/W of the `{ast.unparse(k)}` "
            "micro-batches the loop accumulates per window",
        )


def _micro_times_k(ctx: FileContext, total: ast.AST) -> ast.AST | None:
    """``micro * K`` with no number of processes: the K factor, else None. The micro-batch is
    the factor that names it (``micro_batch_size``, ``engine.train_micro_batch_size_per_gpu()``)."""
    factors = mult_factors(total)
    if len(factors) != 2 or any(ctx.mentions_world(f) for f in factors):
        return None
    micro = [f for f in factors if "micro" in ast.unparse(f).lower()]
    if len(micro) != 1:
        return None
    k = factors[1] if micro[0] is factors[0] else factors[0]
    return k if ctx.mentions_accum(k) or ast.unparse(k).lower() in ("k", "accum", "ga") else None


@rule("AG152")
def train_batch_set_without_world(ctx: FileContext) -> Iterator[Finding]:
    if not ctx.deepspeed:
        return
    for call in ctx.of(ast.Call):
        if call_attr(call) != "set_train_batch_size" or len(call.args) != 1:
            continue
        k = _micro_times_k(ctx, call.args[0])
        if k is None:
            continue
        yield ctx.finding(
            "AG152",
            call,
            f"`set_train_batch_size({ast.unparse(call.args[0])})` gives the micro-batch times "
            f"`{ast.unparse(k)}` with no number of processes; DeepSpeed's train batch is the "
            f"global one and it sets gradient_accumulation_steps = that / ({_MICRO} x W) = "
            f"`{ast.unparse(k)}` / W: on W > 1 processes each rank steps after 1/W of the "
            f"`{ast.unparse(k)}` micro-batches meant per update",
            fix=f"multiply by the number of processes: "
                f"`set_train_batch_size({ast.unparse(call.args[0])} * engine.dp_world_size)`",
        )
        return
