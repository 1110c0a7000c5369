"""Framework integrations: exact token-normalised accumulation and the accumulation checks
for the transformers ``Trainer`` (:mod:`.transformers`), Lightning (:mod:`.lightning`) and
Accelerate (:mod:`.accelerate`).

Importing this package imports no framework: each submodule imports its framework when it
is imported itself (``accelerate`` only when its functions are called). The checks the
callbacks share live in :mod:`._checks` (token-weight probe + the observation layer).
"""

from accumguard.integrations._checks import Finding

__all__ = ["Finding"]
