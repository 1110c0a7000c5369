"""A catalog of training loops under the audit contract: correct and broken, per engine.

Every loop here is a real training loop, ``loop(ctx: LoopContext) -> None``
(:mod:`accumguard.verify.contract`), written the way people write them: it wraps
``ctx.model`` in the engine (DDP, FSDP2, ZeroRedundancyOptimizer over DDP,
DeepSpeed), builds the optimizer with ``ctx.make_optimizer`` and trains over
``ctx.batches``. Three kinds:

* ``accumulator``: driven by :class:`accumguard.Accumulator` with
  ``engine="auto"`` (the adapter is picked from the wrapped model);
* ``correct``: hand-written loops that are right, in different styles
  (``no_sync``, ``require_backward_grad_sync`` set before the forward, FSDP2
  ``set_requires_gradient_sync``, DeepSpeed's own accumulation with the config
  GA = K); they are the audit's false-alarm checks;
* ``broken``: one known failure class each (F1-F5), so the audit must fail
  them *and* name the class.

The demo, the tests and users looking for an example all use :func:`catalog`.
Loops are ``functools.partial`` objects of module-level functions, so they can
be pickled into the ranks the audit spawns.

A correct hand-written loop normalises like the reference: per window it
all-gathers the valid-token count N (over micro-steps and ranks) and backprops
``loss_sum · W / N`` (every engine here averages gradients over the W ranks).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from accumguard.core.errors import ConfigError
from accumguard.verify.contract import Loop, LoopContext

__all__ = ["ENGINES", "CatalogLoop", "catalog", "engine_available", "engine_title", "wrap_engine",
           "accumulator_loop", "handwritten_loop"]

# Engine keys of the catalog, in display order. "fsdp2-zero2" keeps the unsharded
# parameters after forward (reshard_after_forward=False), "fsdp2-zero3" frees them.
ENGINES = ("ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3", "deepspeed-z1", "deepspeed-z2",
           "deepspeed-z3")

_ENGINE_TITLES = {
    "ddp": "DDP",
    "zero1": "ZeRO-1 (torch ZeroRedundancyOptimizer over DDP)",
    "fsdp2-zero2": "FSDP2, reshard_after_forward=False (ZeRO-2-like)",
    "fsdp2-zero3": "FSDP2, reshard_after_forward=True (ZeRO-3-like)",
    "deepspeed-z1": "DeepSpeed ZeRO-1",
    "deepspeed-z2": "DeepSpeed ZeRO-2",
    "deepspeed-z3": "DeepSpeed ZeRO-3",
}


def engine_title(engine: str) -> str:
    return _ENGINE_TITLES.get(engine, engine)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")


def engine_available(engine: str) -> str | None:
    """``None`` if ``engine`` can run here, else a one-line reason (checked in the parent,
    without importing DeepSpeed: only whether it is installed, and whether the accumguard
    adapter module imports)."""
    import importlib
    import importlib.util

    _check_engine(engine)
    if engine.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install 'accumguard[deepspeed]')"
    module = {"zero1": "zero1", "fsdp2-zero2": "fsdp2", "fsdp2-zero3": "fsdp2"}.get(engine)
    if engine.startswith("deepspeed"):
        module = "deepspeed"
    if module is not None:
        try:
            importlib.import_module(f"accumguard.engines.{module}")
        except Exception as exc:  # noqa: BLE001 - any failure means "adapter unavailable"
            return f"adapter unavailable: accumguard.engines.{module}: {type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------------------- wrapping
@dataclass
class Wrapped:
    """What a loop trains with after wrapping ``ctx.model`` in its engine."""

    model: Any                      # DDP / FSDP2 root / DeepSpeed engine
    optimizer: Any                  # torch optimizer (for DeepSpeed: the engine's base optimizer)
    scheduler: Any
    deepspeed: bool = False


def _deepspeed_config(ctx: LoopContext, stage: int, ga: int,
                      clipping: bool = True) -> dict[str, Any]:
    rows = 1
    first = ctx.batches[0] if ctx.batches else None
    if isinstance(first, dict):
        t = next((v for v in first.values() if isinstance(v, torch.Tensor) and v.dim()), None)
        rows = int(t.shape[0]) if t is not None else 1
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": rows,
        "gradient_accumulation_steps": ga,
        "train_batch_size": rows * ga * ctx.world_size,
        "zero_optimization": {"stage": stage},
        # Our optimizer comes from ctx.make_optimizer (e.g. torch AdamW/SGD).
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }
    if clipping:
        # DeepSpeed clips at 1.0 unless told otherwise (F9): say what the setup wants.
        cfg["gradient_clipping"] = float(ctx.max_grad_norm or 0.0)
    return cfg


def _backend() -> str:
    import torch.distributed as dist

    return str(dist.get_backend()) if dist.is_initialized() else "gloo"


def _quiet_deepspeed(device: torch.device) -> Any:
    """Import DeepSpeed with its INFO logging and deprecation noise off. CPU ranks get the
    CPU accelerator (else DeepSpeed picks CUDA whenever a GPU is visible, even under gloo,
    and binds ``LOCAL_RANK`` as a GPU); GPU ranks keep DeepSpeed's own detection."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed on CPU warns about deprecated torch.distributed calls on every collective;
    # in a rank of the demo that noise would bury the table.
    warnings.simplefilter("ignore")
    import deepspeed

    deepspeed.utils.logger.setLevel(logging.ERROR)
    return deepspeed


def wrap_engine(ctx: LoopContext, engine: str, *, ds_ga: int = 1,
                ds_clipping: bool = True) -> Wrapped:
    """Wrap ``ctx.model`` as ``engine`` and build its optimizer and scheduler.

    ``ds_ga`` is DeepSpeed's config ``gradient_accumulation_steps``;
    ``ds_clipping=False`` leaves ``gradient_clipping`` out of the config (its default
    then clips at 1.0: failure class F9).
    """
    _check_engine(engine)
    model = ctx.model
    if engine in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model)
        if engine == "ddp":
            opt = ctx.make_optimizer(ddp.parameters())
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            # The setup gives an optimizer *instance*; ZeRO needs its class and arguments.
            probe = ctx.make_optimizer(ddp.parameters())
            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=type(probe),
                                          **probe.defaults)
        return Wrapped(ddp, opt, ctx.make_scheduler(opt))
    if engine.startswith("fsdp2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        reshard = engine == "fsdp2-zero3"
        # An explicit mesh on the rank's device type: FSDP2's default mesh is CUDA whenever
        # CUDA is visible, even for CPU ranks under gloo.
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for block in getattr(model, "blocks", ()):
            fully_shard(block, reshard_after_forward=reshard, mesh=mesh)
        fully_shard(model, reshard_after_forward=reshard, mesh=mesh)
        opt = ctx.make_optimizer(model.parameters())
        return Wrapped(model, opt, ctx.make_scheduler(opt))
    deepspeed = _quiet_deepspeed(ctx.device)
    deepspeed.init_distributed(dist_backend=_backend())  # reuses the audit's process group
    stage = int(engine[-1])
    opt = ctx.make_optimizer(model.parameters())
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                        config=_deepspeed_config(ctx, stage, ds_ga, ds_clipping))
    # The scheduler drives the base optimizer's param_groups, which DeepSpeed steps.
    return Wrapped(eng, opt, ctx.make_scheduler(opt), deepspeed=True)


def _count(ctx: LoopContext, batch: Any) -> float:
    if ctx.setup.count_fn is not None:
        return float(torch.as_tensor(ctx.setup.count_fn(batch)).sum())
    from accumguard.accumulate.accumulator import batch_size

    return float(batch_size(batch))


def _global_count(ctx: LoopContext, window: list[Any]) -> float:
    """Valid tokens of this window over all ranks: one all-gather (not a reduce, so that it
    is never mistaken for a gradient collective)."""
    import torch.distributed as dist

    # On the rank's device: NCCL has no CPU path ("no backend for cpu").
    local = torch.tensor([sum(_count(ctx, b) for b in window)], dtype=torch.float64,
                         device=ctx.device)
    if ctx.world_size == 1:
        return float(local)
    out = [torch.zeros_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(out, local)
    return float(sum(float(t) for t in out))


def _windows(ctx: LoopContext) -> Iterator[list[Any]]:
    k = ctx.accumulation_steps
    for start in range(0, len(ctx.batches), k):
        yield ctx.batches[start:start + k]


# ----------------------------------------------------------------------------- the loops
def accumulator_loop(ctx: LoopContext, *, engine: str) -> None:
    """The Accumulator on ``engine``, adapter picked by ``engine="auto"``.

    DeepSpeed runs with config GA = 1, so the adapter coalesces the window's
    backwards into one gradient reduction per optimizer step.
    """
    from accumguard import Accumulator

    w = wrap_engine(ctx, engine, ds_ga=1)
    acc = Accumulator(w.model, None if w.deepspeed else w.optimizer,
                      accumulation_steps=ctx.accumulation_steps, engine="auto",
                      scheduler=w.scheduler, max_grad_norm=ctx.max_grad_norm,
                      count_fn=ctx.setup.count_fn)
    with acc:
        for window in acc.windows(ctx.batches):
            for micro in window:
                with micro:
                    loss_sum, _ = ctx.loss_fn(w.model, micro.batch)
                    micro.backward(loss_sum)


def _sync_context(w: Wrapped, engine: str, style: str, is_last: bool) -> Any:
    """The engine's "do not reduce yet" switch, entered *before* the forward."""
    if is_last or w.deepspeed:
        if style == "flag" and engine in ("ddp", "zero1"):
            w.model.require_backward_grad_sync = True
        if engine.startswith("fsdp2"):
            w.model.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if engine.startswith("fsdp2"):
        w.model.set_requires_gradient_sync(False)
        return contextlib.nullcontext()
    if style == "flag":
        # nanoGPT style: the flag is read at forward time, so it is set before the forward.
        w.model.require_backward_grad_sync = False
        return contextlib.nullcontext()
    return w.model.no_sync()


def handwritten_loop(ctx: LoopContext, *, engine: str, bug: str | None = None,
                     style: str = "no_sync") -> None:
    """A hand-written accumulation loop on ``engine``, correct when ``bug`` is None.

    ``bug`` injects exactly one failure class:

    * ``"F1"``: optimizer/scheduler step and zero_grad after *every* micro-step
      (loss = micro-batch mean / K, the common form);
    * ``"F2"``: DeepSpeed config ``gradient_accumulation_steps: 1`` while the loop
      accumulates K backwards by hand and calls ``engine.step()`` once per window;
    * ``"F3"``: ``model.zero_grad()`` at the start of every micro-step;
    * ``"F4"``: the LR scheduler stepped every micro-step;
    * ``"F5"``: loss = micro-batch mean / K with uneven token counts.

    ``style`` (correct DDP loops): ``"no_sync"`` (context around forward+backward) or
    ``"flag"`` (``require_backward_grad_sync`` set before the forward).
    On DeepSpeed the correct loop uses the engine's own accumulation: config GA = K,
    ``engine.backward`` and ``engine.step()`` after every micro-batch.
    """
    if bug not in (None, "F1", "F2", "F3", "F4", "F5"):
        raise ConfigError(f"unknown bug {bug!r}; expected None, F1, F2, F3, F4 or F5")
    ds = engine.startswith("deepspeed")
    if bug == "F2" and not ds:
        raise ConfigError(f"bug {bug} is a DeepSpeed configuration bug; use a deepspeed engine")
    if bug in ("F1", "F3") and ds:
        raise ConfigError(f"bug {bug} is not in the catalog for DeepSpeed (its engine.step() "
                          "owns the optimizer step and zero_grad); use ddp, zero1 or fsdp2")
    if bug == "F4":
        # torch rightly warns that the scheduler stepped before the optimizer: that is the bug.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
    k = ctx.accumulation_steps
    w = wrap_engine(ctx, engine, ds_ga=1 if bug == "F2" else k)
    model, opt, sched = w.model, w.optimizer, w.scheduler
    world = ctx.world_size

    for window in _windows(ctx):
        n_window = _global_count(ctx, window)
        for i, batch in enumerate(window):
            last = i == len(window) - 1
            if bug == "F3":
                model.zero_grad()
            sync = contextlib.nullcontext() if bug == "F1" else _sync_context(w, engine, style,
                                                                              last)
            with sync:
                loss_sum, n = ctx.loss_fn(model, batch)
                if bug in ("F1", "F5"):
                    loss = loss_sum / n / k
                else:
                    loss = loss_sum * world / n_window
                if w.deepspeed:
                    # The engine averages over ranks; no ÷GA of its own on top of ours.
                    model.backward(loss, scale_wrt_gas=False)
                else:
                    loss.backward()
            if w.deepspeed:
                # Native GA: step() every micro-step, the engine knows the boundary.
                # F2: GA=1 in the config, step() only after the K backwards.
                if bug != "F2" or last:
                    model.step()
            elif bug == "F1" or last:
                if ctx.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), ctx.max_grad_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
            if sched is not None and (last or bug in ("F1", "F4")):
                sched.step()


# ----------------------------------------------------------------------------- the catalog
@dataclass(frozen=True)
class CatalogLoop:
    """One loop of the catalog and what the audit must say about it.

    ``expected`` is ``"pass"`` for accumulator and correct loops, else the failure
    class id the diagnosis must name.
    """

    engine: str
    name: str
    kind: str            # "accumulator" | "correct" | "broken"
    expected: str        # "pass" | "F1" | "F2" | ...
    description: str
    loop: Loop

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.name}"


_BROKEN_TEXT = {
    "F1": "optimizer.step() + zero_grad() every micro-step",
    "F2": "DeepSpeed config GA=1, manual accumulation, one engine.step() per window",
    "F3": "model.zero_grad() at the start of every micro-step",
    "F4": "scheduler.step() every micro-step",
    "F5": "loss = micro-batch mean / K (uneven tokens)",
}

# What each engine gets in the full matrix: broken classes, and extra correct styles.
_MATRIX: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ddp": (("F1", "F3", "F4", "F5"), ("no_sync", "flag")),
    "zero1": (("F3",), ("no_sync",)),
    "fsdp2-zero2": (("F5",), ("no_sync",)),
    "fsdp2-zero3": (("F1",), ("no_sync",)),
    "deepspeed-z1": (("F2",), ("no_sync",)),
    "deepspeed-z2": (("F2",), ("no_sync",)),
    "deepspeed-z3": ((), ("no_sync",)),
}

_QUICK: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ddp": (("F1", "F5"), ("no_sync",)),
    "zero1": (("F3",), ()),
    "fsdp2-zero2": (("F5",), ()),
    "fsdp2-zero3": ((), ()),
    "deepspeed-z1": ((), ()),
    "deepspeed-z2": (("F2",), ()),
    "deepspeed-z3": ((), ()),
}


def _correct_text(engine: str, style: str) -> str:
    if engine.startswith("deepspeed"):
        return "config GA=K, engine.backward + engine.step() every micro-step"
    if engine.startswith("fsdp2"):
        return "set_requires_gradient_sync(last) before forward, loss·W/N"
    if style == "flag":
        return "require_backward_grad_sync=last before forward, loss·W/N"
    return "no_sync() around forward+backward, loss·W/N"


def catalog(engines: tuple[str, ...] | list[str] = ENGINES, *, quick: bool = False,
            bugs: tuple[str, ...] | None = None) -> list[CatalogLoop]:
    """The loops the demo runs on ``engines``: per engine the Accumulator, the correct
    hand-written loop(s) and the broken loops of the matrix (``quick``: a smaller one;
    ``bugs``: override the broken classes, e.g. ``("F1", "F5")``)."""
    out: list[CatalogLoop] = []
    table = _QUICK if quick else _MATRIX
    for engine in engines:
        _check_engine(engine)
        broken, styles = table[engine]
        if bugs is not None:
            ds = engine.startswith("deepspeed")
            broken = tuple(b for b in bugs if (b == "F2") == ds or (ds and b in ("F4", "F5")))
        out.append(CatalogLoop(engine, "accumulator", "accumulator", "pass",
                               "accumguard.Accumulator(engine='auto')",
                               functools.partial(accumulator_loop, engine=engine)))
        for style in styles:
            if style == "flag" and not engine.startswith(("ddp", "zero1")):
                continue
            name = "correct" if style == "no_sync" else f"correct-{style}"
            out.append(CatalogLoop(engine, name, "correct", "pass", _correct_text(engine, style),
                                   functools.partial(handwritten_loop, engine=engine,
                                                     style=style)))
        for bug in broken:
            out.append(CatalogLoop(engine, f"bug-{bug}", "broken", bug, _BROKEN_TEXT[bug],
                                   functools.partial(handwritten_loop, engine=engine, bug=bug)))
    return out
