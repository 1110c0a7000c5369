"""accumguard: gradient accumulation that provably equals the large batch.

The public API is small: :class:`Accumulator` drives any supported engine
correctly; :class:`Boundary` is the framework-free state machine behind it;
:func:`run_on_ranks` runs a function on real distributed ranks;
:func:`reference_run` is the single-process truth everything is compared to;
:func:`guard` watches any training loop at run time.
Optional parts (DeepSpeed, plots, the CLI) are imported only when used.
"""

from accumguard.accumulator import AccumulationConfig, Accumulator, StepResult, Window
from accumguard.core import Boundary
from accumguard.engines import Engine, resolve_engine
from accumguard.errors import (
    AccumguardError,
    AccumguardWarning,
    AccumulationError,
    ConfigError,
    DistributedError,
    RankFailedError,
    RankTimeoutError,
    UsageError,
)
from accumguard.guard import AccumulationGuard, guard  # binds the name to the function
from accumguard.launch import run_on_ranks
from accumguard.reference import reference_run, relative_update_error
from accumguard.scaling import GradReduction, loss_scale

try:
    from importlib.metadata import version as _version

    __version__ = _version("accumguard")
except Exception:  # noqa: BLE001 - running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "AccumguardError",
    "AccumguardWarning",
    "AccumulationConfig",
    "AccumulationError",
    "AccumulationGuard",
    "Accumulator",
    "Boundary",
    "ConfigError",
    "DistributedError",
    "Engine",
    "GradReduction",
    "RankFailedError",
    "RankTimeoutError",
    "StepResult",
    "UsageError",
    "Window",
    "guard",
    "loss_scale",
    "reference_run",
    "relative_update_error",
    "resolve_engine",
    "run_on_ranks",
]
