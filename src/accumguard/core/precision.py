"""F12's size: how far K gradients summed in a low-precision dtype drift from their exact sum,
and the K from which that drift is an error (pure Python). The run-time rule
(``observe/_precision_rules``) and the static rules (lint's AG120/AG126, the DeepSpeed
config's AG204) read the bound from here, so they agree on one number.

Each of the K-1 additions rounds to the dtype's unit roundoff u, an expected relative drift
of u*sqrt(K)/3 (:func:`f12_drift`). A correct loop at that compute precision sits about u
from the exact gradient, and the audit allows twice that floor (2u); F12 is an error when
the expected drift is ``F12_ERROR_FACTOR`` times that bound, from :func:`f12_error_k`
micro-steps on (144, whatever u is).
"""

from __future__ import annotations

import math

__all__ = ["F12_ERROR_FACTOR", "f12_drift", "f12_error_k"]

#: F12 is an error when the expected drift is this many times the audit's bound for a
#: correct loop at the same compute precision (2u): the measured drift follows the model
#: within 15 %, so a factor 2 is a margin, not a guess (bf16: K >= 144 is 1.6e-2 and more).
F12_ERROR_FACTOR = 2.0


def f12_drift(u: float, k: int) -> float:
    """Expected relative drift of K gradients summed in a dtype of unit roundoff u: each
    of the K-1 additions rounds with an error uniform in +-u of the running sum (standard
    deviation u/sqrt(3)), the running sum grows linearly, so the errors add up to about
    (u/sqrt(3)) * sqrt(K/3) = u*sqrt(K)/3 of the final sum (bf16, K = 32: 7.4e-3; measured
    on blind round 6's b12: 6.6e-3)."""
    return u * math.sqrt(k) / 3.0


def f12_error_k() -> int:
    """The smallest K whose expected drift reaches F12_ERROR_FACTOR times the 2u bound
    (independent of u: u*sqrt(K)/3 >= factor*2u <=> K >= (6*factor)^2)."""
    return math.ceil((F12_ERROR_FACTOR * 6.0) ** 2 - 1e-9)
