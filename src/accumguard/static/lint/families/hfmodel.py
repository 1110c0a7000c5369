"""A ``Trainer.compute_loss`` override that runs the forward through ``self.model`` (F10):
AG306.

The Hugging Face Trainer hands ``compute_loss(model, inputs, ...)`` the model it wrapped for
the run (DDP on several processes, the DeepSpeed engine); ``self.model`` is the module inside.
A forward through ``self.model`` never passes through the wrapper: DDP's reducer is not armed
and the backward averages nothing over the ranks, so each rank steps on its own gradient.
On one process the two are the same module: a warning, naming the multi-process case.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from accumguard.static.findings import Finding
from accumguard.static.lint._ast import dotted
from accumguard.static.lint._context import FileContext
from accumguard.static.lint._rule import rule
from accumguard.static.lint.families._hftrainer import trainer_methods


@rule("AG306")
def compute_loss_forwards_self_model(ctx: FileContext) -> Iterator[Finding]:
    for cls, fn in trainer_methods(ctx, "compute_loss"):
        params = [a.arg for a in fn.args.args]
        if len(params) < 2 or params[1] != "model":
            continue
        calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
        if any(isinstance(c.func, ast.Name) and c.func.id == "model" for c in calls):
            continue  # the wrapped model runs a forward too
        for c in calls:
            if dotted(c.func) == "self.model":
                yield ctx.finding(
                    "AG306", c,
                    f"`{cls.name}.compute_loss` runs the forward through `self.model`, not the "
                    "`model` the Trainer hands it: on several processes that is the module "
                    "inside the DDP wrapper (or DeepSpeed engine), so the backward averages "
                    "nothing over the ranks and each rank steps on its own gradient")
                break
