"""Checkpoint and resume at an accumulation boundary, with the Accumulator's own state.

A resumed run is only the same run if it restarts exactly where the interrupted one
stopped: at a boundary (no half-accumulated gradient is saved anywhere), with the same
K and world size (else the effective batch changes mid-run), the same window and step
counters, and the data iterator advanced by the micro-batches already consumed.

Two formats, one per engine family:

* DDP, FSDP2 and plain modules: torch distributed checkpoint (DCP). Model and
  optimizer state come from ``torch.distributed.checkpoint.state_dict.get_state_dict``
  (sharded DTensors stay sharded on FSDP2; each rank writes its part), next to the
  Accumulator's state and the scheduler's.
* DeepSpeed: ``engine.save_checkpoint(dir, client_state={"accumguard": ...})``, the
  engine's own format (ZeRO partitions, its scheduler), with the Accumulator's state
  in the client state it returns on ``load_checkpoint``.

Recipe (every rank calls both)::

    for window in acc.windows(loader):
        window.run(loss_fn)
        if acc.optimizer_steps % 100 == 0:
            save_checkpoint(path, acc, scheduler=sched)
    ...
    # a fresh process: build model/optimizer/scheduler/Accumulator as before, then
    load_checkpoint(path, acc, scheduler=sched)
    loader = itertools.islice(loader, acc.micro_batches_consumed, None)  # same data order

``torch.distributed.optim.ZeroRedundancyOptimizer`` is not supported by DCP's
``get_state_dict``; it is refused with the manual recipe.

With fp32 master weights (``Accumulator(..., master_weights=True)``) the optimizer steps
the masters, not the model's parameters: its state is mapped to parameter names through
:meth:`~accumguard.engines.precision.MasterWeights.module`, and the masters themselves are
saved in the Accumulator's state, so a resumed run continues bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accumguard.accumulate.accumulator import Accumulator
from accumguard.core.errors import ConfigError
from accumguard.engines.base import Scheduler

if TYPE_CHECKING:  # (DeepSpeed ships no type information: the name documents the type)
    import torch
    from deepspeed import DeepSpeedEngine

__all__ = ["load_checkpoint", "save_checkpoint"]

_KEY = "accumguard"


def _is_deepspeed(acc: Accumulator) -> bool:
    return bool(acc.engine.owns_optimizer)


def _check_optimizer(acc: Accumulator) -> None:
    if acc.engine.name == "zero1":
        raise ConfigError(
            "save_checkpoint() got a ZeroRedundancyOptimizer, which torch distributed "
            "checkpoint cannot read; expected DDP, FSDP2 or DeepSpeed. Save it by hand: "
            "optimizer.consolidate_state_dict(to=0), then on rank 0 torch.save "
            "({'model': ..., 'optim': optimizer.state_dict(), 'accumguard': acc.state_dict()})")


def _stepped_module(acc: Accumulator) -> torch.nn.Module:
    """What the optimizer steps, under the model's parameter names (masters swapped in)."""
    assert acc.masters is not None
    return acc.masters.module(getattr(acc.model, "module", acc.model))


def _state_dicts(acc: Accumulator) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        get_state_dict,
    )

    opt = acc.optimizer
    assert opt is not None  # only DeepSpeed (another path) has none
    if acc.masters is None:
        return get_state_dict(acc.model, opt)
    return get_model_state_dict(acc.model), get_optimizer_state_dict(_stepped_module(acc), opt)


def _set_state_dicts(acc: Accumulator, model_sd: dict[str, Any], optim_sd: dict[str, Any]
                     ) -> None:
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )

    opt = acc.optimizer
    assert opt is not None  # only DeepSpeed (another path) has none
    if acc.masters is None:
        set_state_dict(acc.model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
        return
    set_model_state_dict(acc.model, model_sd)
    # The optimizer state belongs to the fp32 masters: loaded onto them, it stays fp32.
    set_optimizer_state_dict(_stepped_module(acc), opt, optim_sd)
    acc.masters.copy_to_model()


def save_checkpoint(path: str, acc: Accumulator, *, scheduler: Scheduler | None = None,
                    tag: str | None = None) -> None:
    """Save model, optimizer, scheduler and Accumulator state at a boundary (every rank).

    Raises :class:`~accumguard.core.errors.UsageError` in the middle of a window (the
    gradients accumulated so far would be lost on resume)."""
    state = acc.state_dict()  # refuses a mid-window checkpoint, with the fix
    sched = scheduler if scheduler is not None else acc.scheduler
    if _is_deepspeed(acc):
        engine: DeepSpeedEngine = acc.model
        client = {_KEY: state}
        if sched is not None and sched is not getattr(engine, "lr_scheduler", None):
            client["scheduler"] = sched.state_dict()
        engine.save_checkpoint(path, tag=tag, client_state=client)
        return
    _check_optimizer(acc)
    # torch.distributed.checkpoint.save, from the module that exports it (the package
    # imports it without re-exporting it to a type checker).
    from torch.distributed.checkpoint.state_dict_saver import save

    model_sd, optim_sd = _state_dicts(acc)
    doc: dict[str, Any] = {"model": model_sd, "optim": optim_sd, _KEY: state}
    if sched is not None:
        doc["scheduler"] = sched.state_dict()
    save(doc, checkpoint_id=path)


def load_checkpoint(path: str, acc: Accumulator, *, scheduler: Scheduler | None = None,
                    tag: str | None = None) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote into a freshly built setup (every rank).

    Refuses (ConfigError) a checkpoint taken with another K, normalisation or world size.
    Returns the Accumulator state that was loaded; advance your data iterator by its
    ``micro_batches_consumed``."""
    sched = scheduler if scheduler is not None else acc.scheduler
    if _is_deepspeed(acc):
        engine: DeepSpeedEngine = acc.model
        loaded, client = engine.load_checkpoint(path, tag=tag)
        if loaded is None or not isinstance(client, dict) or _KEY not in client:
            raise ConfigError(
                f"no DeepSpeed checkpoint with accumguard state at {path!r} (tag {tag!r}); "
                "expected one written by accumguard.accumulate.checkpoint.save_checkpoint. "
                "Check the path and tag")
        acc.load_state_dict(client[_KEY])
        if sched is not None and "scheduler" in client:
            sched.load_state_dict(client["scheduler"])
        return dict(client[_KEY])
    _check_optimizer(acc)
    # torch.distributed.checkpoint.load (see save_checkpoint).
    from torch.distributed.checkpoint.state_dict_loader import load

    model_sd, optim_sd = _state_dicts(acc)
    doc: dict[str, Any] = {"model": model_sd, "optim": optim_sd, _KEY: acc.state_dict()}
    if sched is not None:
        doc["scheduler"] = sched.state_dict()
    load(doc, checkpoint_id=path)
    acc.load_state_dict(doc[_KEY])  # K / normalisation / world size checked first
    _set_state_dicts(acc, doc["model"], doc["optim"])
    if sched is not None:
        sched.load_state_dict(doc["scheduler"])
    return dict(doc[_KEY])
