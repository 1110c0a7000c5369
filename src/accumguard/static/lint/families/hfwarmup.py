"""An HF ``TrainingArguments`` step count computed in per-device micro-batches (F4): AG313.

``TrainingArguments(warmup_steps=..., max_steps=...)`` counts optimizer steps: with
``gradient_accumulation_steps`` K > 1 on W ranks one optimizer step consumes K x W x the
per-device batch. A value computed in the script as the dataset's size over the per-device
batch (``math.ceil(n_train / per_device_batch) * epochs * warmup_frac``) with no K and no
world size in it counts micro-batches of one device: the warm-up (or the run) lasts K x W x
longer than intended. Read through one level of the file's names: the keyword's value, a
name or attribute assigned once, or a property/function of the file returning it (and the
names assigned in that function). Not reported when K is literally 1, or when anything in the
expression names the accumulation steps, the world size or the number of processes.

Also AG313: a ``TrainerCallback`` writing a learning-rate schedule into the optimizer (or
building a scheduler) sized from ``len(train_dataloader)`` with nothing in the class naming
the accumulation steps, the file's TrainingArguments accumulating K > 1.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule

__all__ = ["callback_horizon_in_micro_batches", "trainer_steps_in_micro_batches"]

_KEYS = ("warmup_steps", "max_steps")
#: the step counts of a scheduler's kwargs (``lr_scheduler_kwargs``: the WSD schedule's)
_SCHED_KEYS = ("num_warmup_steps", "num_decay_steps", "num_stable_steps", "num_training_steps")
_BATCH = re.compile(r"batch|bsz|(^|[._])bs\b", re.IGNORECASE)
_ACCUM = re.compile(r"accum|global_batch|effective|total_batch", re.IGNORECASE)
_WORLD = re.compile(r"world|num_processes|n_?gpus|num_gpus|n_?procs|device_count|"
                    r"nproc|replicas|ranks", re.IGNORECASE)
_SCALED = re.compile(f"{_ACCUM.pattern}|{_WORLD.pattern}", re.IGNORECASE)


def _resolve(ctx: FileContext, expr: ast.AST) -> list[ast.AST]:
    """``expr`` and what it names in the file, one level: a name or attribute assigned once,
    or a function/property of the file so named (its body)."""
    out = [expr]
    name = dotted(expr)
    if name is None:
        return out
    last = name.split(".")[-1]
    values = ctx.values_by_name().get(name) or ctx.values_by_name().get(last) or []
    if len(values) == 1:
        out.append(values[0])
    fns = ctx.functions_by_name().get(last, [])
    if len(fns) == 1:
        out.append(fns[0])
    return out


def _text(nodes: list[ast.AST]) -> str:
    return " ".join(ast.unparse(n) for n in nodes)


def _per_device_quotient(nodes: list[ast.AST]) -> bool:
    """A division whose divisor names a batch size (``n_train / per_device_batch``)."""
    for root in nodes:
        for n in ast.walk(root):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv) \
                    and _BATCH.search(ast.unparse(n.right)):
                return True
    return False


def _k_above_one(ctx: FileContext, call: ast.Call) -> bool:
    for kw in call.keywords:
        if kw.arg == "gradient_accumulation_steps":
            v = ctx.int_value(kw.value)
            return v is None or v > 1
    return False


@rule("AG313")
def trainer_steps_in_micro_batches(ctx: FileContext) -> Iterator[Finding]:
    for call in ctx.of(ast.Call):
        if not isinstance(call, ast.Call) or (dotted(call.func) or "").split(".")[-1] not in (
                "TrainingArguments", "SFTConfig", "DPOConfig", "GRPOConfig", "RewardConfig"):
            continue
        if not _k_above_one(ctx, call):
            continue
        for kw in call.keywords:
            for key, value, nodes in _step_counts(ctx, kw):
                if len(nodes) < 2 or not _per_device_quotient(nodes) \
                        or _ACCUM.search(_text(nodes)) or any(ctx.mentions_accum(n) for n in nodes
                                                              if not isinstance(n, FUNCS)):
                    continue
                per_rank = bool(_WORLD.search(_text(nodes)))
                yield ctx.finding(
                    "AG313", value,
                    f"`{key}` (`{ast.unparse(value)}`) is computed from the dataset's size over "
                    "the per-device batch"
                    + (" and the world size, with no accumulation steps in it: it counts one "
                       "rank's micro-batches" if per_rank else
                       " with no accumulation steps and no world size in it: it counts one "
                       "device's micro-batches")
                    + f", while the Trainer counts `{key}` in optimizer steps (K"
                    + ("" if per_rank else " x W") + " micro-batches each), so it lasts K"
                    + ("" if per_rank else " x W") + " times longer than intended")


def _step_counts(ctx: FileContext, kw: ast.keyword
                 ) -> Iterator[tuple[str, ast.AST, list[ast.AST]]]:
    """(key, value, what it resolves to) of the keyword's step counts: ``warmup_steps`` /
    ``max_steps`` themselves, or the step counts of ``lr_scheduler_kwargs`` (a dict literal,
    or one a function of the file returns)."""
    if kw.arg in _KEYS:
        yield kw.arg, kw.value, _with_assignments(_resolve(ctx, kw.value))
        return
    if kw.arg != "lr_scheduler_kwargs":
        return
    target = kw.value.func if isinstance(kw.value, ast.Call) else kw.value
    for node in _resolve(ctx, target):
        dicts = [node] if isinstance(node, ast.Dict) else [
            r.value for r in ast.walk(node) if isinstance(r, ast.Return)
            and isinstance(r.value, ast.Dict)] if isinstance(node, FUNCS) else []
        for d in dicts:
            for k, v in zip(d.keys, d.values, strict=True):
                if isinstance(k, ast.Constant) and k.value in _SCHED_KEYS:
                    found = _with_assignments([v, *(_resolve(ctx, v)[1:]),
                                               *([node] if isinstance(node, FUNCS) else [])])
                    yield str(k.value), v, found


def _with_assignments(nodes: list[ast.AST]) -> list[ast.AST]:
    """``nodes`` and the values assigned inside a function among them (one level more)."""
    out = list(nodes)
    for fn in [n for n in nodes if isinstance(n, FUNCS)]:
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign):
                out.append(n.value)
    return out


def _trainer_k_above_one(ctx: FileContext) -> bool:
    """Some TrainingArguments (or TRL config) of the file is built with K other than 1."""
    return any(isinstance(c, ast.Call) and (dotted(c.func) or "").split(".")[-1] in (
        "TrainingArguments", "SFTConfig", "DPOConfig", "GRPOConfig", "RewardConfig")
        and _k_above_one(ctx, c) for c in ctx.of(ast.Call))


@rule("AG313")
def callback_horizon_in_micro_batches(ctx: FileContext) -> Iterator[Finding]:
    """A ``TrainerCallback`` that sizes a learning-rate schedule from ``len(train_dataloader)``
    (the Trainer hands callbacks its DataLoader: one device's micro-batches per epoch) with
    nothing in the class naming the accumulation steps, in a file whose TrainingArguments
    accumulate K > 1: the Trainer takes one optimizer step per K of those batches, so a
    schedule counted in them lasts K x longer than the run."""
    if not _trainer_k_above_one(ctx):
        return
    for cls in ctx.of(ast.ClassDef):
        if not isinstance(cls, ast.ClassDef) or not any(
                (dotted(b) or "").endswith("TrainerCallback") for b in cls.bases):
            continue
        text = ast.unparse(cls)
        if _SCALED.search(text) or ("param_groups" not in text and "lr_scheduler" not in text):
            continue
        for n in ast.walk(cls):
            if isinstance(n, ast.Call) and dotted(n.func) == "len" and n.args \
                    and (dotted(n.args[0]) or "").split(".")[-1] == "train_dataloader":
                yield ctx.finding(
                    "AG313", n,
                    f"`{ast.unparse(n)}` counts this device's micro-batches per epoch, and the "
                    f"schedule `{cls.name}` writes into the optimizer is sized from it with no "
                    "accumulation steps in it, while the Trainer steps once per K micro-batches "
                    "(gradient_accumulation_steps > 1): the schedule lasts K x longer than the "
                    "run, its warm-up and decay K x late",
                    fix="divide by args.gradient_accumulation_steps (or size the schedule from "
                        "state.max_steps, the Trainer's own count of optimizer steps)")
                break
