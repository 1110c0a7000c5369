"""The observer's named configurations: what each product asks the observation layer for.

Each product of accumguard runs the same :class:`~._observer.Observer` for a different
contract, and its constructor flags only make sense in a few combinations. They are written
here, once, by name, instead of being combined at every call site:

``watch``      every model the script builds (auto roots), loss records, the window loss,
               conservation on a ~1 % time budget (or exactly every N-th window);
``guard``      the guarded model only, conservation within its budget, attribution of
               backwards to the model; no loss records (the guard judges no token weights);
``callbacks``  one step in N observed fully (sampled records: the other windows are counted
               without hooks), no loss records (the callbacks' probe reads the token weights);
``rescale``    no checks at all: only the events a Lightning manual-optimisation rescale
               listens to (the first clip of a window).
"""

from __future__ import annotations

from dataclasses import dataclass

from accumguard.observe._checksum import CONSERVATION_BUDGET

__all__ = ["ObserverProfile", "callbacks", "guard", "rescale", "watch"]


#: watch's conservation checks: the share of the run's time they may take
WATCH_BUDGET = 0.01


@dataclass(frozen=True)
class ObserverProfile:
    """Keyword arguments of :class:`~._observer.Observer` (see its docstring), by name."""

    name: str
    auto_roots: bool = False
    conservation: bool = True
    record_updates: bool = False
    every: int = 1
    budget: float | None = None
    attribute: bool = False
    record_losses: bool = True
    window_loss: bool = True
    sampled_records: bool = False
    window_size: int | None = None
    observe_steps: int | None = None


def watch(every: int = 1, record_updates: bool = False,
          observe_steps: int | None = None) -> ObserverProfile:
    """``accumguard watch`` (and in-process ``recording()``): ``every == 1`` checks
    conservation on as many windows as 1 % of the run's time allows (always the first two);
    ``every == N`` on exactly every N-th window. ``observe_steps``: observation ends after
    that many optimizer steps (and the first epoch's end, when in reach); None: never."""
    return ObserverProfile("watch", auto_roots=True, record_updates=record_updates,
                           every=every, budget=WATCH_BUDGET if every == 1 else None,
                           observe_steps=observe_steps)


def guard() -> ObserverProfile:
    """The runtime guard over one model."""
    return ObserverProfile("guard", budget=CONSERVATION_BUDGET, attribute=True,
                           record_losses=False)


def callbacks(every_n_steps: int, window_size: int | None) -> ObserverProfile:
    """The framework callbacks' checks: one step in ``every_n_steps`` observed fully."""
    return ObserverProfile("callbacks", every=every_n_steps,
                           budget=None if every_n_steps == 1 else CONSERVATION_BUDGET,
                           record_losses=False, window_loss=False, sampled_records=True,
                           window_size=window_size)


def rescale() -> ObserverProfile:
    """Events only (Lightning's manual-optimisation rescale before the first clip)."""
    return ObserverProfile("rescale", conservation=False, record_losses=False,
                           window_loss=False)
