"""Modules held in a plain dict or list (F10): AG344.

``nn.Module`` registers a submodule assigned to an attribute, and the modules inside an
``nn.ModuleDict``/``nn.ModuleList``; the modules inside a plain ``dict`` or ``list``
(``self.heads = {name: nn.Linear(...) for ...}``) it does not. A data-parallel wrapper (DDP,
Lightning's DDP strategy, Fabric, Accelerate, DeepSpeed) reduces the gradients of the
module's registered parameters only, so an optimizer given those heads' parameters steps them
on each rank's own gradient: the ranks' copies drift apart (they are missing from the
``state_dict`` too).

Reported on the assignment, in a file that trains data-parallel, when the class's optimizer
is built from those modules' parameters (in the method that builds it, or anywhere the
attribute's ``.parameters()`` reach an optimizer constructor).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import (
    OPTIMIZER_CLASSES,
    dotted,
    last_part,
    walk_all,
)
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._parallel import data_parallel

__all__ = ["modules_in_a_plain_container"]

_MODULE_CTORS = frozenset({
    "Linear", "Sequential", "Embedding", "Conv1d", "Conv2d", "LayerNorm", "LSTM", "GRU", "MLP",
    "Bilinear", "MultiheadAttention", "TransformerEncoderLayer",
})


def _module_classes(ctx: FileContext) -> set[str]:
    return {c.name for c in ctx.of(ast.ClassDef)
            if any("Module" in (dotted(b) or "") for b in c.bases)} | _MODULE_CTORS


def _holds_modules(value: ast.AST, modules: set[str]) -> bool:
    """A plain dict/list (literal or comprehension) whose items are module constructions."""
    if isinstance(value, ast.DictComp):
        items: list[ast.AST] = [value.value]
    elif isinstance(value, ast.ListComp):
        items = [value.elt]
    elif isinstance(value, ast.Dict):
        items = [v for v in value.values if v is not None]
    elif isinstance(value, ast.List):
        items = list(value.elts)
    else:
        return False
    return bool(items) and all(
        isinstance(i, ast.Call) and (dotted(i.func) or "").rsplit(".", 1)[-1] in modules
        for i in items)


def _optimized(ctx: FileContext, cls: ast.ClassDef, attr: str) -> bool:
    """``self.<attr>``'s modules' parameters reach an optimizer: the method of ``cls`` that
    builds one (``configure_optimizers``, or any method calling an optimizer class) reads
    ``self.<attr>``."""
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        builds = fn.name == "configure_optimizers" or any(
            isinstance(n, ast.Call) and last_part(dotted(n.func)) in OPTIMIZER_CLASSES
            for n in walk_all(fn))
        if builds and any(dotted(n) == f"self.{attr}" for n in walk_all(fn)):
            return True
    return False


@rule("AG344")
def modules_in_a_plain_container(ctx: FileContext) -> Iterator[Finding]:
    if not data_parallel(ctx):
        return
    modules = _module_classes(ctx)
    for cls in ctx.of(ast.ClassDef):
        if not any("Module" in (dotted(b) or "") for b in cls.bases):
            continue
        for n in walk_all(cls):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(t := n.targets[0], ast.Attribute) and dotted(t.value) == "self"
                    and _holds_modules(n.value, modules) and _optimized(ctx, cls, t.attr)):
                continue
            kind = "dict" if isinstance(n.value, ast.Dict | ast.DictComp) else "list"
            yield ctx.finding(
                "AG344", n,
                f"`self.{t.attr}` holds modules in a plain {kind}: nn.Module does not register "
                f"them, so the data-parallel wrapper never averages their gradients while the "
                f"optimizer steps them (each rank on its own gradient: the ranks' copies drift "
                f"apart)",
                fix=f"hold them in an nn.Module{'Dict' if kind == 'dict' else 'List'} "
                    f"(`self.{t.attr} = nn.Module{'Dict' if kind == 'dict' else 'List'}(...)`)")
