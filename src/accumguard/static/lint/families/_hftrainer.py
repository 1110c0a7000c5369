"""The methods a Hugging Face ``Trainer`` subclass of the file overrides (shared by the rules
that read ``compute_loss``, ``training_step`` and ``get_batch_samples`` overrides)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext

__all__ = ["trainer_methods"]


def trainer_methods(ctx: FileContext, name: str) -> Iterator[tuple[ast.ClassDef, ast.FunctionDef]]:
    """(class, method) for every method ``name`` of a class whose base ends in ``Trainer``."""
    for fn in ctx.of(ast.FunctionDef):
        if not isinstance(fn, ast.FunctionDef) or fn.name != name:
            continue
        cls = ctx.enclosing(fn, (ast.ClassDef,))
        if isinstance(cls, ast.ClassDef) and any(
                (dotted(b) or "").endswith("Trainer") for b in cls.bases):
            yield cls, fn
