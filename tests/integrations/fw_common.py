"""Shared pieces of the framework-integration tests: tiny models from configs, seeded token
data with uneven valid counts, the summed token loss, and the fp64 reference comparison.

They live in :mod:`accumguard.demo.frameworks` (``accumguard demo --frameworks`` runs the
same models on the same data); this module re-exports them under the names the tests use.
Nothing is downloaded: models are built from small configs with random weights.
"""

from __future__ import annotations

from accumguard.demo.frameworks import (
    BROKEN_MIN,
    EXACT_TOL,
    IGNORE,
    SEQ,
    VOCAB,
    count_tokens,
    flat_params,
    mean_loss,
    plain,
    sum_loss,
    tiny_gpt2,
    tiny_llama,
    token_samples,
    update_errors,
)

__all__ = ["BROKEN_MIN", "EXACT_TOL", "IGNORE", "SEQ", "VOCAB", "count_tokens", "flat_params",
           "mean_loss", "plain", "sum_loss", "tiny_gpt2", "tiny_llama", "token_samples",
           "update_errors"]
