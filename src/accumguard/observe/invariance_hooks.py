"""Two hooks ``accumguard invariance`` needs inside the command's processes, nothing else.

* **Same seeds in every run**: ``random``, ``numpy`` (if installed) and ``torch``
  are seeded at start-up from ``ACCUMGUARD_SEED``, so a script that does not seed
  itself still initialises the same model for every K (a script that seeds
  itself simply re-seeds).
* **Not invariant by construction**: BatchNorm in train mode and in-batch negatives are
  noted where they run (:mod:`.invariance_construction`), so a difference they cause is
  not reported as an accumulation bug.
* **Dropout off** (``ACCUMGUARD_NO_DROPOUT=1``): dropout masks are drawn per
  micro-batch shape, so K = 1 and K = 4 drop different units even with the same
  seed, and the runs differ for a reason unrelated to accumulation. Every
  dropout entry point of torch becomes the identity: the functional forms
  (``nn.Dropout`` and friends call them at run time), the ``torch.*`` ops, and
  the ``dropout_p`` of ``scaled_dot_product_attention``. Patched before user code
  imports anything, so ``from torch.nn.functional import dropout`` gets the
  patched function too; each patch keeps the wrapped signature.

Installed by :func:`install_from_env`, which the observation layer's bootstrap
runs in every process of the command; a no-op when neither variable is set.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Mapping

#: torch's function being replaced, and its replacement (arguments passed through)
_Fn = Callable[..., object]

__all__ = ["install_from_env", "seed_everything", "disable_dropout", "ENV_SEED",
           "ENV_NO_DROPOUT"]

ENV_SEED = "ACCUMGUARD_SEED"
ENV_NO_DROPOUT = "ACCUMGUARD_NO_DROPOUT"
ENV_OBSERVE_DIR = "ACCUMGUARD_OBSERVE_DIR"  # watch._recording.ENV_DIR (observe may not import it)

_FUNCTIONAL = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
               "feature_alpha_dropout")
_TORCH_OPS = ("dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    import torch

    torch.manual_seed(seed)


def _identity(orig: _Fn) -> _Fn:
    @functools.wraps(orig)
    def no_dropout(input: object, *args: object, **kwargs: object) -> object:  # noqa: A002
        return input

    no_dropout.__accumguard_original__ = orig  # type: ignore[attr-defined]
    return no_dropout


def _sdpa_without_dropout(orig: _Fn) -> _Fn:
    @functools.wraps(orig)
    def sdpa(*args: object, **kwargs: object) -> object:
        if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            args = (*args[:4], 0.0, *args[5:])
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        return orig(*args, **kwargs)

    sdpa.__accumguard_original__ = orig  # type: ignore[attr-defined]
    return sdpa


def disable_dropout() -> Callable[[], None]:
    """Make every dropout of torch the identity; returns the function that restores them."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own alias

    saved: list[tuple[object, str, object]] = []

    def patch(owner: object, name: str, make: Callable[[_Fn], _Fn]) -> None:
        orig = getattr(owner, name, None)
        if orig is None or hasattr(orig, "__accumguard_original__"):
            return
        saved.append((owner, name, orig))
        setattr(owner, name, make(orig))

    for name in _FUNCTIONAL:
        patch(F, name, _identity)
    for name in _TORCH_OPS:
        patch(torch, name, _identity)
    patch(F, "scaled_dot_product_attention", _sdpa_without_dropout)

    def restore() -> None:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)
        saved.clear()

    return restore


def install_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """Apply what the environment asks for; return what was done (for the record)."""
    env = os.environ if environ is None else environ
    done: list[str] = []
    seed = env.get(ENV_SEED)
    if seed is not None and seed.strip():
        seed_everything(int(seed))
        done.append(f"seed={int(seed)}")
    if env.get(ENV_NO_DROPOUT, "").strip() not in ("", "0"):
        disable_dropout()
        done.append("dropout=identity")
    out_dir = env.get(ENV_OBSERVE_DIR, "")
    if seed is not None and seed.strip() and out_dir:  # invariance under the bootstrap
        from accumguard.observe.invariance_construction import install_probes

        install_probes(out_dir)
        done.append("construction probes")
    return done
