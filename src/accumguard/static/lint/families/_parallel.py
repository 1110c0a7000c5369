"""Whether a file trains data-parallel: what a Lightning ``Trainer``/``Fabric`` call says of
its devices, and whether any wrapper, engine or launcher call of the file spreads the model
over ranks. Shared by the rules whose finding only exists on several ranks."""

from __future__ import annotations

import ast

from accumguard.static.lint._ast import DDP_WRAPPERS, call_attr, dotted
from accumguard.static.lint._context import FileContext

__all__ = ["data_parallel", "multi_device"]


def multi_device(call: ast.Call) -> bool | None:
    """What a Lightning ``Trainer(...)``/``Fabric(...)`` call says of data parallelism: True
    for more than one device or a DDP/FSDP strategy, False for one device, None when it
    says neither."""
    kw = {k.arg: k.value for k in call.keywords}
    devices, strategy = kw.get("devices"), kw.get("strategy")
    if isinstance(devices, ast.Constant) and devices.value in (1, "1"):
        return False
    if isinstance(devices, ast.Constant) and isinstance(devices.value, int) and devices.value > 1:
        return True
    if isinstance(strategy, ast.Constant) and isinstance(strategy.value, str) \
            and ("ddp" in strategy.value or "fsdp" in strategy.value):
        return True
    return None


def data_parallel(ctx: FileContext) -> bool:
    """The file wraps a model for data parallelism: DDP/FSDP, a DeepSpeed engine, an
    Accelerator's ``prepare``, or a Lightning ``Trainer``/``Fabric`` on several devices."""
    for c in ctx.of(ast.Call):
        name = (dotted(c.func) or "").rsplit(".", 1)[-1]
        if name in DDP_WRAPPERS or name == "initialize" and "deepspeed" in (dotted(c.func) or "") \
                or call_attr(c) == "prepare" and "accelerator" in (dotted(c.func) or "").lower():
            return True
        if name in ("Trainer", "Fabric") and multi_device(c):
            return True
    return False
