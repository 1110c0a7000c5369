"""Lightning's ``pytorch_lightning.callbacks_factory`` entry point: ``ACCUMGUARD_LIGHTNING=1``
adds :class:`accumguard.integrations.lightning.AccumguardCallback` (checks only: it never
rescales a gradient) to every Lightning ``Trainer`` the process builds, without editing the
script. Without the variable this returns nothing and imports nothing: a run that did not
ask is never changed. Lightning calls every installed factory when it builds a ``Trainer``;
an error here would stop that ``Trainer``, so none leaves this module (said on stderr)."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["ENV", "callbacks"]

#: the environment variable that turns the callback on ("1", "true", "yes", "on")
ENV = "ACCUMGUARD_LIGHTNING"


def callbacks() -> list[Any]:
    """``[AccumguardCallback()]`` when ``ACCUMGUARD_LIGHTNING`` asks for it, else ``[]``."""
    if os.environ.get(ENV, "").strip().lower() not in ("1", "true", "yes", "on"):
        return []
    try:
        from accumguard.integrations.lightning import AccumguardCallback

        cb = AccumguardCallback()
        cb.from_environment = True
        return [cb]
    except Exception as exc:  # noqa: BLE001 - never stop the user's Trainer
        print(f"accumguard: {ENV} is set but the Lightning callback could not be made "
              f"({type(exc).__name__}: {exc}); the Trainer runs without it", file=sys.stderr)
        return []
