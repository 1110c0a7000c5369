"""F12's size: how far K gradients summed in a low-precision dtype drift from their exact sum,
and the K from which that is an error (pure Python). The run-time rule
(``observe/_precision_rules``) and the static rules (lint's AG120/AG126, the DeepSpeed
config's AG204) read the bound from here, so they agree on one number.

Each of the K-1 additions rounds to the dtype's unit roundoff u, an expected relative drift
of u*sqrt(K)/3 (:func:`f12_drift`). The large batch sums its gradient once, in fp32 (a
correct loop at bf16 compute sums its micro-gradients in fp32 too: autocast, an fp32
buffer, FSDP2 ``reduce_dtype=float32``, DeepSpeed ``grad_accum_dtype: fp32``), so a window
summed in bf16/fp16 is a different update by construction, and the dtype of the sum is a
fact read from the run (or the source), not a statistical guess. It is an error once the
sum's own drift is a measurable share of the update's error: from the K at which u*sqrt(K)/3
reaches ``F12_ERROR_FACTOR`` times the 2u bound the audit allows a correct loop at that
precision (a third of it: K >= 4, the shortest window ``watch`` judges). Every finding states
the drift at the run's K, which grows as sqrt(K) (bf16: 2.6e-3 at K = 4, 1.8e-2 at K = 256).
"""

from __future__ import annotations

import math

__all__ = ["F12_ERROR_FACTOR", "f12_drift", "f12_error_k"]

#: F12 is an error when the expected drift of the low-precision sum is this share of the
#: audit's 2u bound for a correct loop at the same compute precision: a third of it (2u/3)
#: is where the sum's own rounding is a measurable part of the update's error (K >= 4);
#: windows of 2 or 3 backwards drift less than bf16's own rounding of one gradient.
F12_ERROR_FACTOR = 1.0 / 3.0


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
