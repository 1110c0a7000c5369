"""The Accumulator: the correct accumulation state machine, driving an engine adapter.

It prefetches a window of K micro-batches, counts samples/tokens over the window
and all ranks, scales each micro-step's loss with :func:`accumguard.core.loss_scale`,
and does everything that must happen once per optimizer step exactly at the
boundary. Engine specifics live below it, in :mod:`accumguard.engines`.
"""

from accumguard.accumulate.accumulator import AccumulationConfig, Accumulator, StepResult, Window
from accumguard.accumulate.checkpoint import load_checkpoint, save_checkpoint

__all__ = ["AccumulationConfig", "Accumulator", "StepResult", "Window", "load_checkpoint",
           "save_checkpoint"]
