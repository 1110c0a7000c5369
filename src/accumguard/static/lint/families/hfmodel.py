"""A ``Trainer.compute_loss`` override that runs the forward through ``self.model`` (F10):
AG306.

The Hugging Face Trainer hands ``compute_loss(model, inputs, ...)`` the model it wrapped for
the run (DDP on several processes, the DeepSpeed engine); ``self.model`` is the module inside.
A forward through ``self.model`` never passes through the wrapper: DDP's reducer is not armed
and the backward averages nothing over the ranks, so each rank steps on its own gradient.
On one process the two are the same module: a warning, naming the multi-process case; an
error when the file runs on several processes for certain (a ``ddp_backend``,
``init_process_group``, a ``WORLD_SIZE``/``LOCAL_RANK`` read, ``torchrun``). The forward may be
a method of the module (``self.model.encode(ids)``; calls that run no forward, such as
``self.model.parameters()`` or ``.generate()``, are not judged), and may sit in a method of
the class that ``compute_loss`` calls (``self._rewards(chosen, rejected)``), two calls deep.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from accumguard.static.findings import Confidence, Finding, Severity
from accumguard.static.lint._ast import FUNCS, dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._hftrainer import trainer_methods
from accumguard.static.lint.families.wrapbypass import _NOT_FORWARD, _NOT_FORWARD_PREFIX

_SEVERAL = re.compile(r"ddp_backend|init_process_group|WORLD_SIZE|LOCAL_RANK|torchrun")


def _several_processes(ctx: FileContext) -> bool:
    """An identifier, keyword or string of the file says the run is multi-process."""
    for n in ast.walk(ctx.tree):
        text = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) \
            else n.arg if isinstance(n, ast.keyword) and n.arg else \
            n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else ""
        if _SEVERAL.search(text):
            return True
    return False


def _self_model_forward(call: ast.Call) -> bool:
    """``self.model(...)``, or ``self.model.<method>(...)`` for a method that runs a forward."""
    if dotted(call.func) == "self.model":
        return True
    f = call.func
    return (isinstance(f, ast.Attribute) and dotted(f.value) == "self.model"
            and f.attr not in _NOT_FORWARD and not f.attr.startswith(_NOT_FORWARD_PREFIX))

Func = ast.FunctionDef | ast.AsyncFunctionDef


def _with_helpers(cls: ast.ClassDef, fn: Func) -> list[Func]:
    """``fn`` and the methods of ``cls`` it calls as ``self.name(...)``, two calls deep."""
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    out, frontier = [fn], [fn]
    for _ in range(2):
        found = [methods[c.func.attr] for f in frontier for c in ast.walk(f)
                 if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                 and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"
                 and c.func.attr in methods and methods[c.func.attr] not in out]
        out += found
        frontier = found
    return out


@rule("AG306")
def compute_loss_forwards_self_model(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "compute_loss"):
        params = [a.arg for a in fn.args.args]
        if len(params) < 2 or params[1] != "model":
            continue
        calls = [n for f in _with_helpers(cls, fn) for n in ast.walk(f) if isinstance(n, ast.Call)]
        if any(isinstance(c.func, ast.Name) and c.func.id == "model" for c in calls):
            continue  # the wrapped model runs a forward too
        for c in calls:
            if _self_model_forward(c):
                home = ctx.enclosing(c, FUNCS)
                via = "" if home is fn or not isinstance(home, FUNCS) else \
                    f" (in `{home.name}`, which it calls)"
                finding = ctx.finding(
                    "AG306", c,
                    f"`{cls.name}.compute_loss` runs the forward through "
                    f"`{ast.unparse(c.func)}`{via}, not the "
                    "`model` the Trainer hands it: on several processes that is the module "
                    "inside the DDP wrapper (or DeepSpeed engine), so the backward averages "
                    "nothing over the ranks and each rank steps on its own gradient")
                if _several_processes(ctx):
                    finding = replace(finding, severity=Severity.ERROR, confidence=Confidence.HIGH)
                yield finding
                break
