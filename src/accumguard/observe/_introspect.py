"""What the observer reads off the user's objects, outside the per-micro-step hooks: the
engine kind of a module (cached per type), FSDP2's parameter groups, the dtype a step
updates, the autograd nodes in a forward's output, a DTensor's local shard, the window
loss and the conservation tolerance of a dtype.

Pure functions of torch objects (no observer state): the observer imports them by name,
so a call costs what it did when they lived in :mod:`._observer`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch

__all__ = ["WRAPPERS", "engine_kind", "engine_module", "fsdp_param_groups", "grad_fns", "local", "param_dtype", "tol_for",
           "window_loss"]


def tol_for(dtype: torch.dtype) -> float:
    """Relative conservation tolerance: a lost micro-batch is O(1/K), rounding is O(eps)."""
    return {torch.float64: 1e-6, torch.float32: 1e-3}.get(dtype, 3e-2)


def param_dtype(owner: object) -> str | None:
    """The dtype of the parameters a step updates (an optimizer's groups, or a DeepSpeed
    engine's module); the least precise when mixed. Invariance's tolerance reads it."""
    dtypes: set[torch.dtype] = set()
    with contextlib.suppress(Exception):
        module = getattr(owner, "module", None)  # a DeepSpeed engine: its model's parameters
        if isinstance(module, torch.nn.Module):
            dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
        else:
            dtypes = {p.dtype for g in getattr(owner, "param_groups", []) for p in g["params"]}
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        if dt in dtypes:
            return str(dt).replace("torch.", "")
    return str(next(iter(dtypes))).replace("torch.", "") if dtypes else None


def window_loss(losses: list[torch.Tensor | float]) -> float:
    """Sum in float64 of the window's scalar losses: CPU losses as the floats read at each
    backward, device losses stacked (one reduction and one host read per step)."""
    if not losses:
        return 0.0
    if type(losses[0]) is float:  # (a window's losses share one device)
        return float(sum(float(x) for x in losses))
    try:
        # (a 0-dim loss, the usual one, is stacked as it is: no view op per micro-step)
        return float(torch.stack([x if x.dim() == 0 else x.reshape(())
                                  for x in losses if isinstance(x, torch.Tensor)])
                     .to(torch.float64).sum()) + sum(x for x in losses if type(x) is float)
    except RuntimeError:  # mixed devices or dtypes
        return float(sum(float(x) for x in losses))


def grad_fns(output: object, depth: int = 0) -> list[torch.autograd.graph.Node]:
    """Autograd nodes of the tensors in a forward's output, searched through dicts, lists,
    tuples, dataclasses and plain objects (two levels deep, at most 16 nodes)."""
    if isinstance(output, torch.Tensor):
        return [output.grad_fn] if output.grad_fn is not None else []
    if depth >= 3 or output is None or isinstance(output, (str, bytes, int, float, bool)):
        return []
    values: Iterable[object]
    if isinstance(output, dict):
        values = output.values()
    elif isinstance(output, (list, tuple)):
        values = output
    elif hasattr(output, "__dataclass_fields__"):
        values = [getattr(output, f, None) for f in getattr(output, "__dataclass_fields__")]  # noqa: B009
    elif hasattr(output, "__dict__") and not isinstance(output, torch.nn.Module):
        values = list(vars(output).values())
    else:
        return []
    out: list[torch.autograd.graph.Node] = []
    for v in values:
        out += grad_fns(v, depth + 1)
        if len(out) >= 16:
            break
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


_KINDS: dict[type, str] = {}
#: modules that only forward to the module they hold, by class name -> where they hold it:
#: ``torch.compile``'s OptimizedModule, Lightning Fabric's ``_FabricModule`` (which holds
#: the DDP/FSDP2/DeepSpeed model ``fabric.setup`` made: the script calls the wrapper)
WRAPPERS = {"OptimizedModule": "_orig_mod", "_FabricModule": "_forward_module"}


def engine_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module a transparent wrapper (compile, Fabric; nested) calls, else ``module``."""
    for _ in range(4):
        attr = WRAPPERS.get(type(module).__name__)
        if attr is None:
            break
        # looked up where the wrappers keep it (__dict__, _modules): a getattr that misses
        # goes through Module.__getattr__'s AttributeError, at every root forward
        own = getattr(module, "__dict__", None) or {}
        inner = own.get(attr)
        if inner is None:
            mods = own.get("_modules")
            inner = mods.get(attr) if isinstance(mods, dict) else None
        if not isinstance(inner, torch.nn.Module):
            break
        module = inner
    return module


def engine_kind(module: object) -> str:
    kind = _KINDS.get(type(module))
    if kind is None:
        kind = _KINDS[type(module)] = _kind_of(type(module))
    if kind == "fabric" and isinstance(module, torch.nn.Module):
        return engine_kind(engine_module(module))
    return "local" if kind == "fabric" else kind


def _kind_of(typ: type) -> str:
    for cls in typ.__mro__:
        name = cls.__name__
        if name == "_FabricModule":
            return "fabric"
        if name == "DistributedDataParallel":
            return "ddp"
        if name == "FSDPModule":
            return "fsdp2"
        if name == "DeepSpeedEngine" and cls.__module__.startswith("deepspeed"):
            return "deepspeed"
    return "local"


def fsdp_param_groups(module: torch.nn.Module) -> list[object]:
    """FSDP2's per-module parameter groups (their ``reduce_grads`` is the sync flag)."""
    groups: list[object] = []
    for m in module.modules():
        get_state = getattr(m, "_get_fsdp_state", None)
        if get_state is None:
            continue
        with contextlib.suppress(Exception):
            pg = get_state()._fsdp_param_group
            if pg is not None:
                groups.append(pg)
    return groups


def zero3_valid(prm: torch.nn.Parameter, part: torch.Tensor) -> torch.Tensor:
    """This rank's ZeRO-3 partition of ``prm`` without its padding. DeepSpeed allocates a
    partition with ``torch.empty`` and copies only the parameter's own elements into it, so
    the last rank's padding holds whatever the memory held: compared between two runs it
    differs by anything (2.5e19 measured), though the training is the same."""
    numel, size = getattr(prm, "ds_numel", None), part.numel()
    if not isinstance(numel, int) or size == 0:
        return part
    rank = 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        group = getattr(prm, "ds_process_group", None)
        rank = max(torch.distributed.get_rank(group), 0)
    return part.reshape(-1)[:max(0, min(size, numel - rank * size))]


@torch.no_grad()
def snapshot(opt: object, engine: torch.nn.Module | None,
             names: dict[int, str]) -> dict[str, torch.Tensor]:
    """Float64 CPU copies of the local parameters (shards) a step updates: a DeepSpeed
    engine's (its ZeRO-3 partitions), else an optimizer's groups (``names``: id -> name)."""
    out: dict[str, torch.Tensor] = {}
    if engine is not None:
        for name, prm in getattr(engine, "module", engine).named_parameters():
            part = getattr(prm, "ds_tensor", None)
            t = prm if not isinstance(part, torch.Tensor) else zero3_valid(prm, part)
            out[name] = local(t).detach().to("cpu", torch.float64).clone()
        return out
    i = 0
    for g in getattr(opt, "param_groups", []):
        for prm in g["params"]:
            name = names.get(id(prm), f"param{i}")
            i += 1
            out[name] = local(prm).detach().to("cpu", torch.float64).clone()
    return out
