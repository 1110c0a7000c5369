"""A module or a bare ``nn.Parameter`` held on a Hugging Face ``Trainer`` subclass, outside
its model, stepped by its optimizer (F10): AG325.

The Trainer wraps ``self.model`` for the run (DDP on several processes) and the wrapper
averages the gradients of that model's parameters only. A head, a temperature or learned
loss weights kept as an attribute of the Trainer (``self.score_head = score_head`` in
``__init__``), used in ``compute_loss`` and handed to the optimizer (a ``create_optimizer``
override listing ``self.score_head.parameters()``, or ``self.logit_scale`` itself in a param
group) is never averaged: each process steps its
own copy on its own gradient. Reported when the file never registers it in the model
(``model.add_module(...)``, ``setattr(model, ...)``, ``model.x = ...``) and reduces no
gradient by hand (a ``TrainerCallback`` all-reducing its ``.grad``); an error when the
file's ``TrainingArguments`` set a ``ddp_*`` option (the run is meant for several
processes), a warning otherwise (on one process the two are the same).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import call_attr, dotted, last_part, walk_all
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._hftrainer import trainer_methods
from accumguard.static.lint.families.unreduced import reduces_grads_by_hand

__all__ = ["module_held_on_the_trainer"]


def _held(init: ast.FunctionDef) -> dict[str, ast.AST]:
    """``self.x = <parameter of __init__ or a module built here>``: x -> the value."""
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    out: dict[str, ast.AST] = {}
    for n in walk_all(init):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(t := n.targets[0], ast.Attribute) \
                and isinstance(t.value, ast.Name) and t.value.id == "self" \
                and ((isinstance(n.value, ast.Name) and n.value.id in params)
                     or isinstance(n.value, ast.Call)):
            out[t.attr] = n.value
    return out


def _registered(ctx: FileContext, attr: str, value: ast.AST) -> bool:
    """The held object may be put into a model (read conservatively, whatever it is named
    where that happens): any ``add_module``/``register_module``/``setattr`` call of the
    file, or an assignment of it (or to an attribute of its name) on another object."""
    names = {f"self.{attr}", dotted(value) or ""} - {""}
    if any(call_attr(c) in ("add_module", "register_module", "register_parameter", "setattr") for c in ctx.of(ast.Call)):
        return True
    return any((dotted(n.value) in names or isinstance(n.value, ast.Name)) and any(
        isinstance(t, ast.Attribute) and t.attr == attr and dotted(t) != f"self.{attr}"
        for t in n.targets) or (dotted(n.value) in names and any(
            isinstance(t, ast.Attribute) and dotted(t) not in names for t in n.targets))
        for n in ctx.of(ast.Assign))


def _multi_process(ctx: FileContext) -> bool:
    return any((dotted(c.func) or "").rsplit(".", 1)[-1].endswith(("TrainingArguments", "Config"))
               and any((k.arg or "").startswith("ddp_") for k in c.keywords)
               for c in ctx.of(ast.Call))


@rule("AG325")
def module_held_on_the_trainer(ctx: FileContext) -> Iterator[Finding]:
    if reduces_grads_by_hand(ctx):
        return  # (a callback or hook averaging the held parameter's .grad itself)
    for cls, init in trainer_methods(ctx, "__init__"):
        held = _held(init)
        if not held:
            continue
        for _, opt_fn in ((c, f) for c, f in trainer_methods(ctx, "create_optimizer") if c is cls):
            for attr, value in held.items():
                bare = isinstance(value, ast.Call) and last_part(dotted(value.func)) == "parameter"
                refs: list[ast.AST] = [n for n in walk_all(opt_fn) if isinstance(n, ast.Call)
                        and call_attr(n) in ("parameters", "named_parameters")
                        and dotted(n.func) == f"self.{attr}.{call_attr(n)}"] or [
                    n for n in walk_all(opt_fn) if bare and isinstance(n, ast.Attribute)
                    and dotted(n) == f"self.{attr}"]
                if not refs or _registered(ctx, attr, value):
                    continue
                what = "it (an nn.Parameter)" if bare else "its parameters"
                f = ctx.finding(
                    "AG325", refs[0],
                    f"`self.{attr}` is held on the Trainer `{cls.name}`, not in its model, and "
                    f"its optimizer steps {what}: the Trainer wraps only self.model for "
                    "the run (DDP on several processes), so "
                    + ("its" if bare else "their") + " gradient is never averaged "
                    "over the processes and each steps its own copy")
                yield f if _multi_process(ctx) else replace(
                    f, severity=Severity.WARNING, confidence=Confidence.MEDIUM)
                return
