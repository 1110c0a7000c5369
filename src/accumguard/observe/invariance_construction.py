"""What makes a script not K-invariant by construction, seen from inside its processes
(``accumguard invariance`` only).

Accumulation is exact only when the loss of a window is a sum over its samples: each
sample's term must not depend on which other samples share its micro-batch. Two common
parts of a model break that on purpose, and then K = 1 and K = 4 are different trainings
whatever the loop does:

* **BatchNorm in train mode** (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, and any norm with
  ``track_running_stats=False``): it normalises with the micro-batch's mean and variance;
* **in-batch negatives** (InfoNCE, CLIP, SimCLR, in-batch retrieval losses): a
  ``cross_entropy`` over an ``[n, n]`` similarity matrix whose targets are ``arange(n)``,
  the other samples of the micro-batch being each one's negatives.

Each probe is a patch behind the fail-safe door (:mod:`._failsafe`: an internal error turns
the probes off, never the user's run) that notes the cause once (module class and size, the
loss's call site) in ``<observe dir>/construction-rank-<R>.json``, which
:mod:`accumguard.invariance._records` reads. Installed by
:func:`accumguard.observe.invariance_hooks.install_from_env` when invariance runs the
command (``ACCUMGUARD_SEED`` set) under the observation bootstrap.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from accumguard.observe._failsafe import Failsafe, Maker, Original
from accumguard.observe._patch import Patches

if TYPE_CHECKING:
    import torch

__all__ = ["CONSTRUCTION_FILE", "install_probes"]

CONSTRUCTION_FILE = "construction-rank-{rank}.json"
_OWN = (os.sep + "torch" + os.sep, os.sep + "accumguard" + os.sep)


class _Notes:
    """The causes seen on this process, written to its file when a new one appears."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.seen: dict[str, str] = {}

    def add(self, key: str, text: str) -> None:
        if key in self.seen:
            return
        self.seen[key] = text
        rank = os.environ.get("RANK", "0")
        path = self.out / CONSTRUCTION_FILE.format(rank=rank)
        path.write_text(json.dumps(sorted(self.seen.values())), encoding="utf-8")


def _call_site() -> str:
    """``file:line`` of the first frame outside torch and accumguard (the user's loss)."""
    f = sys._getframe(2)
    while f is not None and any(p in f.f_code.co_filename for p in _OWN):
        f = f.f_back  # type: ignore[assignment]
    return "?" if f is None else f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def _batchnorm(notes: _Notes) -> Maker:
    def make(orig: Original) -> Original:
        def forward(self: torch.nn.Module, input: object, *args: object,  # noqa: A002
                    **kwargs: object) -> object:
            out = orig(self, input, *args, **kwargs)
            if self.training or getattr(self, "running_mean", None) is None:
                name = type(self).__name__
                notes.add(f"bn:{name}", f"{name}({getattr(self, 'num_features', '?')}) "
                          "normalises with the micro-batch's own statistics (train mode): "
                          "each sample's output depends on the micro-batch it is in")
            return out

        return forward

    return make


def _in_batch_negatives(notes: _Notes) -> Maker:
    import torch

    def make(orig: Original) -> Original:
        def cross_entropy(input: object, target: object, *args: object,  # noqa: A002
                          **kwargs: object) -> object:
            out = orig(input, target, *args, **kwargs)
            if (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
                    and input.dim() == 2 and input.shape[0] == input.shape[1] > 1
                    and target.dim() == 1 and not target.is_floating_point()
                    and torch.equal(target, torch.arange(input.shape[0],
                                                         device=target.device))):
                site = _call_site()
                notes.add(f"ce:{site}", f"cross_entropy at {site} over an [n, n] similarity "
                          "matrix with targets arange(n): in-batch negatives (a contrastive "
                          "loss), each sample's negatives are the other samples of its "
                          "micro-batch")
            return out

        return cross_entropy

    return make


def install_probes(out_dir: str | os.PathLike[str]) -> Patches:
    """Patch BatchNorm's forward and ``F.cross_entropy`` (behind their doors)."""
    import torch.nn.functional as F  # noqa: N812 - torch's own alias
    from torch.nn.modules import batchnorm

    failsafe = Failsafe(name="accumguard invariance probes")
    patches = Patches(failsafe)
    failsafe.on_teardown(patches.undo)
    notes = _Notes(Path(out_dir))
    patches.wrap(batchnorm._BatchNorm, "forward", _batchnorm(notes))
    patches.wrap(batchnorm.SyncBatchNorm, "forward", _batchnorm(notes))  # its own forward
    patches.wrap(F, "cross_entropy", _in_batch_negatives(notes))
    return patches
