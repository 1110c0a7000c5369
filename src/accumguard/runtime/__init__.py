"""Run-time pieces: the spawner of real distributed ranks and the runtime guard.

:func:`run_on_ranks` starts W processes with a 127.0.0.1 rendezvous, a hard
timeout and per-rank error reporting; :mod:`.guard` watches a live training loop
for broken accumulation contracts.
"""

from accumguard.runtime.launch import run_on_ranks

__all__ = ["run_on_ranks"]
