"""``accumguard advise``: the communication modes of the user's own engine, measured on the
user's own command (time, collectives, memory, equal updates), and the fastest one that
fits a memory budget. See :mod:`accumguard.advise.run` and docs/advise.md."""

from accumguard.advise._modes import Mode, candidates, not_applicable
from accumguard.advise.run import AdviseOptions, AdviseReport, ModeResult, run_advise

__all__ = ["AdviseOptions", "AdviseReport", "Mode", "ModeResult", "candidates",
           "not_applicable", "run_advise"]
