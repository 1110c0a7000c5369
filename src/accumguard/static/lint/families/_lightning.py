"""What the rules know of Lightning's calls: which hooks run on every batch, and whether
the file's Trainer accumulates (``accumulate_grad_batches`` > 1)."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import dotted, walk_all
from accumguard.static.lint._context import FileContext

#: Lightning calls these on every batch whatever accumulate_grad_batches is
#: (``on_before_optimizer_step`` and ``configure_gradient_clipping`` run once per step)
LIGHTNING_PER_BATCH = ("on_train_batch_end", "on_train_batch_start", "on_after_backward", "on_before_backward")


def lightning_accumulates(ctx: FileContext) -> bool:
    """``accumulate_grad_batches=<K>`` in sight with every value K > 1."""
    values: set[int | None] = set()
    for call in ctx.of(ast.Call):
        for kw in call.keywords:
            if kw.arg == "accumulate_grad_batches":
                values |= ctx.int_candidates(kw.value)
    return bool(values) and all(v is not None and v > 1 for v in values)


def accumulation_given(ctx: FileContext) -> bool:
    """``accumulate_grad_batches=`` passed somewhere, and not as a literal 1 (its value may
    be out of sight: a config's)."""
    return any(kw.arg == "accumulate_grad_batches"
               and not (isinstance(kw.value, ast.Constant) and kw.value.value == 1)
               for call in ctx.of(ast.Call) for kw in call.keywords)


def manual_optimization(cls: ast.ClassDef) -> bool:
    """The class sets ``automatic_optimization = False`` (it steps its own optimizers)."""
    return any(
        isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value is False
        and any((dotted(t) or "").endswith("automatic_optimization") for t in n.targets)
        for n in walk_all(cls)
    )


def automatic_lightning_module(ctx: FileContext, func: ast.AST) -> bool:
    """``func`` is a method of a ``LightningModule`` subclass that leaves automatic
    optimisation on (no ``automatic_optimization = False`` in the class)."""
    cls = ctx.enclosing(func, (ast.ClassDef,))
    if not isinstance(cls, ast.ClassDef) or not any(
            (dotted(b) or "").rsplit(".", 1)[-1] == "LightningModule" for b in cls.bases):
        return False
    return not manual_optimization(cls)


def returned_losses(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """What ``training_step`` returns as its loss: ``return loss`` or ``{"loss": loss}``."""
    out: list[ast.AST] = []
    for n in walk_all(fn):
        if not isinstance(n, ast.Return) or n.value is None:
            continue
        v: ast.AST | None = n.value
        if isinstance(v, ast.Dict):
            v = next((val for key, val in zip(v.keys, v.values, strict=True)
                      if isinstance(key, ast.Constant) and key.value == "loss"), None)
        if v is not None and not (isinstance(v, ast.Constant) and v.value is None):
            out.append(v)
    return out
