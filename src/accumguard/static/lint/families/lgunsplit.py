"""A Lightning schedule sized from a fresh ``train_dataloader()`` on several devices (F4):
AG309.

``len(self.trainer.datamodule.train_dataloader())`` (or ``len(self.train_dataloader())``)
calls the hook again and measures the DataLoader it returns, before Lightning gives it a
DistributedSampler: it counts the whole dataset's batches, while each of the W ranks steps
through its own 1/W. A step-interval schedule sized from it in ``configure_optimizers`` (or a
helper it calls) ends W times late. ``self.trainer.estimated_stepping_batches`` and
``self.trainer.num_training_batches`` count per rank. Silent when the file builds a
DistributedSampler itself or the Trainer runs one device.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import FUNCS, dotted, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._lghorizon import _HORIZON_CTORS


def _several_devices(ctx: FileContext) -> bool:
    """A ``Trainer(...)`` with ``devices`` > 1, ``num_nodes`` > 1 or a ``ddp`` strategy."""
    for c in ctx.of(ast.Call):
        if (dotted(c.func) or "").rsplit(".", 1)[-1] != "Trainer":
            continue
        for kw in c.keywords:
            v = kw.value
            if kw.arg in ("devices", "num_nodes") and isinstance(v, ast.Constant) \
                    and isinstance(v.value, int) and not isinstance(v.value, bool) and v.value > 1:
                return True
            if kw.arg == "strategy" and isinstance(v, ast.Constant) and isinstance(v.value, str) \
                    and v.value.startswith("ddp"):
                return True
    return False


def _fresh_len(node: ast.AST) -> bool:
    """``len(<...>.train_dataloader())``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "len" and len(node.args) == 1
            and isinstance(node.args[0], ast.Call)
            and isinstance(node.args[0].func, ast.Attribute)
            and node.args[0].func.attr == "train_dataloader")


@rule("AG309")
def schedule_from_unsplit_loader(ctx: FileContext) -> Iterator[Finding]:
    if not _several_devices(ctx):
        return
    if any(isinstance(n, ast.Name | ast.Attribute) and (
            (n.id if isinstance(n, ast.Name) else n.attr) == "DistributedSampler")
           for n in ast.walk(ctx.tree)):
        return
    for cfg in ctx.of(ast.FunctionDef):
        if not isinstance(cfg, ast.FunctionDef) or cfg.name != "configure_optimizers":
            continue
        body = list(walk_all(cfg))
        if not any(isinstance(c, ast.Call) and (dotted(c.func) or "").rsplit(".", 1)[-1]
                   in _HORIZON_CTORS for c in body):
            continue
        places: list[ast.AST] = [cfg]
        cls = ctx.enclosing(cfg, (ast.ClassDef,))
        for c in body:  # self.helper() the method calls
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) \
                    and dotted(c.func.value) == "self" and isinstance(cls, ast.ClassDef):
                places += [f for f in cls.body if isinstance(f, FUNCS) and f.name == c.func.attr]
        for place in places:
            nodes = list(walk_all(place))
            hit = next((n for n in nodes if _fresh_len(n)), None)
            if hit is None or any(isinstance(n, ast.Name | ast.Attribute) and ctx.mentions_world(n)
                                  for n in nodes):
                continue  # (divided by the world size there: per rank)
            yield ctx.finding(
                "AG309", hit,
                f"`{ast.unparse(hit)}` sizes the schedule from a DataLoader the hook returns "
                "afresh, before Lightning gives it a DistributedSampler: it counts the whole "
                "dataset's batches while each rank steps through its own share, so the "
                "schedule ends world-size times late")
            break
