"""The core: the facts every other layer shares, with no torch.distributed knowledge.

The exception hierarchy (:mod:`.errors`), the boundary state machine
(:mod:`.boundary`), the one function that derives loss scales from what an engine
does to gradients (:mod:`.scaling`), the failure taxonomy F1-F14
(:mod:`.taxonomy`), the one finding type every check reports (:mod:`.findings`), and F12's
drift bound (:mod:`.precision`).
Pure Python: the static checks import it without torch.
"""

from accumguard.core.boundary import Boundary, check_accumulation_steps
from accumguard.core.errors import (
    AccumguardError,
    AccumguardWarning,
    AccumulationError,
    ConfigError,
    DistributedError,
    MissingDependencyError,
    RankFailedError,
    RankTimeoutError,
    UsageError,
)
from accumguard.core.findings import Confidence, Finding, Severity
from accumguard.core.scaling import GradReduction, loss_scale
from accumguard.core.taxonomy import TAXONOMY, FailureClass

__all__ = [
    "AccumguardError",
    "AccumguardWarning",
    "AccumulationError",
    "Boundary",
    "ConfigError",
    "Confidence",
    "DistributedError",
    "FailureClass",
    "Finding",
    "GradReduction",
    "MissingDependencyError",
    "RankFailedError",
    "RankTimeoutError",
    "Severity",
    "TAXONOMY",
    "UsageError",
    "check_accumulation_steps",
    "loss_scale",
]
