"""The one exception hierarchy of accumguard.

Every error the library raises on purpose derives from :class:`AccumguardError`,
so ``except AccumguardError`` catches all of them and nothing else::

    AccumguardError
    ├── ConfigError (ValueError)          bad argument or engine config; raised at construction
    │   └── LintError                     a script/config file cannot be analysed; path:line:col
    ├── UsageError (RuntimeError)         the API was driven in an illegal order
    ├── AccumulationError (RuntimeError)  the accumulation contract was broken at run time
    │   ├── NonFiniteError                a window met a NaN/Inf loss or gradient (nonfinite="raise")
    │   └── (guard violations subclass this: see accumguard.runtime.guard)
    ├── DistributedError (RuntimeError)   a rank crashed, hung, or ranks disagreed
    │   ├── RankFailedError               a worker raised; carries rank and traceback
    │   └── RankTimeoutError              a worker did not finish in time
    └── MissingDependencyError (ImportError)  an optional extra is not installed

Warnings use :class:`AccumguardWarning`. Messages follow one shape: what was
seen, what was expected, and how to fix it.
"""

from __future__ import annotations


class AccumguardError(Exception):
    """Base class of every error accumguard raises on purpose."""


class ConfigError(AccumguardError, ValueError):
    """A constructor argument or an engine configuration is invalid."""


class LintError(ConfigError):
    """A script or config file cannot be analysed (syntax error, unreadable, nested too
    deeply, too large). ``path``/``line``/``col`` (1-based) say where, ruff style."""

    def __init__(self, path: str, line: int, col: int, message: str) -> None:
        self.path = path
        self.line = line
        self.col = col
        self.message = message
        super().__init__(f"{path}:{line}:{col}: {message}")


class UsageError(AccumguardError, RuntimeError):
    """The API was called in an order that cannot be correct (e.g. two backwards
    in one micro-step)."""


class AccumulationError(AccumguardError, RuntimeError):
    """The accumulation contract (one sync, one step per window, ...) was broken."""


class NonFiniteError(AccumulationError):
    """A window produced a non-finite loss or gradient and the Accumulator was built with
    ``nonfinite="raise"``. The window was already discarded (no optimizer step, scheduler
    held, gradients zeroed) on every rank, so catching this and going on is safe.
    ``window`` is the window index; ``ranks`` maps each rank whose loss was non-finite to
    the first micro-step where it was (empty when only the gradient was)."""

    def __init__(self, message: str, *, window: int, ranks: dict[int, int]) -> None:
        self.window = window
        self.ranks = ranks
        super().__init__(message)


class DistributedError(AccumguardError, RuntimeError):
    """A distributed run failed: a rank crashed, hung, or ranks disagreed."""


class RankFailedError(DistributedError):
    """A worker rank raised. ``rank`` and ``remote_traceback`` say where and why."""

    def __init__(self, rank: int, remote_traceback: str, message: str | None = None) -> None:
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(message or f"[rank {rank}] worker raised:\n{remote_traceback}")


class RankTimeoutError(DistributedError):
    """One or more ranks did not finish within the timeout. ``starting``: the ones among
    them that had not even joined the process group (a machine too loaded for W ranks)."""

    def __init__(self, ranks: list[int], timeout: float,
                 starting: list[int] | None = None) -> None:
        self.ranks = ranks
        self.timeout = timeout
        self.starting = list(starting or [])
        names = ", ".join(f"rank {r}" for r in ranks)
        if self.starting and len(self.starting) == len(ranks):
            why = ("None of them had finished starting (importing torch, joining the "
                   "rendezvous): this machine is too slow or too loaded for this many ranks. "
                   "Use fewer ranks or a longer timeout")
        else:
            why = ("A rank that waits forever usually sits in a collective that another rank "
                   "never entered (different number of micro-batches per rank, or a rank that "
                   "returned early); raise the timeout only if the work is genuinely that slow")
            if self.starting:
                why = (f"{', '.join(f'rank {r}' for r in self.starting)} had not finished "
                       f"starting. {why}")
        super().__init__(f"{names} did not finish within {timeout:g} s and were killed. {why}.")


class MissingDependencyError(AccumguardError, ImportError):
    """An optional dependency is needed for this feature."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'accumguard[{extra}]'"
        )


class AccumguardWarning(UserWarning):
    """A suspicious but not necessarily wrong setup (e.g. an engine default that clips)."""


def rank_prefix(rank: int | None) -> str:
    """``"[rank N] "`` for distributed messages, ``""`` outside a process group."""
    return "" if rank is None else f"[rank {rank}] "
