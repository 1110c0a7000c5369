"""The candidate modes per engine: what each one is, the exact call that gives it, and why a
mode cannot apply. Pure data (no torch); the in-process side is
:mod:`accumguard.runtime._advise_modes`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AS_WRITTEN", "UNAPPLIABLE", "Mode", "candidates", "not_applicable"]


@dataclass(frozen=True)
class Mode:
    """One way to run the window: ``name`` (the runtime's mode, or ``as-written``), what it
    does, and the line a user writes to get it."""

    name: str
    what: str
    how: str


AS_WRITTEN = Mode("as-written", "the command as it is", "keep the script as it is")

_MODES: dict[str, list[Mode]] = {
    "ddp": [
        Mode("ddp-every", "DDP all-reduces on every micro-step",
             "no model.no_sync(): every backward all-reduces"),
        Mode("ddp-deferred", "DDP all-reduces once per window (no_sync on micro-steps 1..K-1)",
             "for micro-steps 1..K-1: `with model.no_sync(): loss = ...(model(x)); "
             "loss.backward()` (forward AND backward inside)"),
    ],
    "fsdp2": [
        Mode("fsdp2-every", "FSDP2 reduce-scatters on every micro-step",
             "model.set_requires_gradient_sync(True) on every micro-step"),
        Mode("fsdp2-deferred", "FSDP2 reduce-scatters once per window, parameters resharded "
             "as configured", "model.set_requires_gradient_sync(is_last_micro_step) before "
             "each forward"),
        Mode("fsdp2-unsharded", "FSDP2 sync deferred and parameters kept unsharded over the "
             "window (one all-gather round per window)",
             "model.set_requires_gradient_sync(is_last); model.set_reshard_after_forward(False);"
             " model.set_reshard_after_backward(is_last) before each forward"),
    ],
}

_COALESCE_HOW = ("`with engine.coalesce_grad_reduction():` around the window's K "
                 "`engine.backward(loss / K, scale_wrt_gas=False)`, then one `engine.step()` "
                 "(config \"gradient_accumulation_steps\": 1; DeepSpeed >= 0.19)")

_DS = {
    "ds-coalesced": Mode(
        "ds-coalesced", "DeepSpeed ZeRO reduces the window's summed gradient once per "
        "optimizer step (coalesced reduction) instead of in every micro-step's backward",
        _COALESCE_HOW),
    "ds-coalesced-contiguous-off": Mode(
        "ds-coalesced-contiguous-off", "coalesced reduction without contiguous gradient "
        "buffers", _COALESCE_HOW + '; "zero_optimization": {"contiguous_gradients": false}'),
    "ds-contiguous-gradients-off": Mode(
        "ds-contiguous-gradients-off", "DeepSpeed ZeRO-1/2 without contiguous gradient buffers",
        '"zero_optimization": {"contiguous_gradients": false}'),
    "ds-overlap-comm-on": Mode(
        "ds-overlap-comm-on", "DeepSpeed reductions overlapped with the backward",
        '"zero_optimization": {"overlap_comm": true}'),
    "ds-z3-params-persistent": Mode(
        "ds-z3-params-persistent", "ZeRO-3 parameters kept gathered (never re-gathered "
        "within or across windows; ZeRO-2-like parameter memory)",
        '"zero_optimization": {"stage3_param_persistence_threshold": 1e12}'),
}
_ZERO12 = ["ds-coalesced", "ds-contiguous-gradients-off", "ds-coalesced-contiguous-off",
           "ds-overlap-comm-on"]
_DS_BY_STAGE = {1: _ZERO12, 2: _ZERO12,
                # ds-coalesced on ZeRO-3 once gave updates off by 5e18: the update record
                # then read the last rank's partition padding, which DeepSpeed leaves
                # uninitialised (fixed since: observe/_introspect.zero3_valid); re-measured
                # equal in session "ds3" (docs/dev/performance-journal.md)
                3: ["ds-coalesced", "ds-overlap-comm-on", "ds-z3-params-persistent"]}

#: Modes ``advise`` lists but cannot apply from outside the command, and why.
UNAPPLIABLE: dict[str, tuple[Mode, str]] = {
    "deepspeed": (Mode(
        "accumguard-deferred", "accumguard's Accumulator with "
        "DeepSpeedEngineAdapter(engine, sync=\"deferred\") (coalesced reduction, flushed "
        "without DeepSpeed's extra gradient copies; window_memory=\"unsharded\" on ZeRO-3)",
        "Accumulator(engine, None, accumulation_steps=K, engine=DeepSpeedEngineAdapter("
        "engine, sync=\"deferred\")) with config \"gradient_accumulation_steps\": 1"),
        "it replaces the training loop itself (the Accumulator drives backward and step), "
        "which advise never rewrites; its cost against the limit: `accumguard bench "
        "--paired --only ZeRO`"),
}

_WHY_NOT = {
    "local": "one process without DDP/FSDP2/DeepSpeed: there is no gradient communication to "
             "choose",
    "zero1": "torch ZeroRedundancyOptimizer over DDP: the DDP modes apply to its DDP model; "
             "not measured separately in this version",
    "deepspeed": "DeepSpeed without ZeRO (stage 0): no ZeRO setting to choose",
}


def candidates(engine: str, zero_stage: int | None = None) -> list[Mode]:
    """The modes ``advise`` runs for this engine, the command as written first."""
    if engine == "deepspeed":
        return [AS_WRITTEN, *(_DS[n] for n in _DS_BY_STAGE.get(zero_stage or 0, []))]
    return [AS_WRITTEN, *_MODES.get(engine, [])]


def not_applicable(engine: str, k: int, zero_stage: int | None = None) -> str | None:
    """Why no other mode applies (None: the engine's modes apply)."""
    if engine == "deepspeed" and (zero_stage or 0) in _DS_BY_STAGE:
        return None  # ZeRO settings apply whatever K is
    if k < 2:
        return (f"the command steps after every backward (K={k}): there is no window to "
                "defer communication over")
    if engine in _MODES:
        return None
    return _WHY_NOT.get(engine, f"engine {engine!r}: no candidate modes")
