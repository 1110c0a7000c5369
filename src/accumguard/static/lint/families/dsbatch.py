"""A DeepSpeed ``train_batch_size`` written without the number of processes: AG152.

``train_batch_size`` is the global batch: micro-batch x gradient_accumulation_steps x
world size. A config that gives ``train_batch_size`` and ``train_micro_batch_size_per_gpu``
but not ``gradient_accumulation_steps`` lets DeepSpeed derive the accumulation as
``train_batch_size / (micro x W)``. Written as ``micro * K`` (the script's accumulation
count, no world size), that derivation gives K / W: on W > 1 processes every rank steps
after K / W micro-batches instead of K, the global batch is W times smaller than the loop's
accumulation says, and a schedule sized in windows of K runs W times fast. A warning: on one
process the arithmetic agrees.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import mult_factors
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
