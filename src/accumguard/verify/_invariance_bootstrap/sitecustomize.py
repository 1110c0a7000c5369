"""``accumguard invariance``'s start-up hook: same seeds, and dropout off on request.

Put on ``PYTHONPATH`` right after the observation layer's bootstrap directory
(:data:`accumguard.runtime.watch.BOOTSTRAP_DIR`), whose ``sitecustomize`` runs the
next ``sitecustomize`` on the path: this one. It registers
:func:`accumguard.observe.invariance_hooks.install_from_env` to run as soon as torch
is imported (never importing torch itself), then runs the next ``sitecustomize``
after its own directory (the environment's own), if any.
"""

import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(e) if e else "" for e in sys.path]
    after = entries.index(here) + 1 if here in entries else 0
    for entry in sys.path[after:]:
        if not entry or os.path.abspath(entry) == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location(
                "_accumguard_invariance_chained_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


def _start() -> None:
    if not (os.environ.get("ACCUMGUARD_SEED") or os.environ.get("ACCUMGUARD_NO_DROPOUT")):
        return
    try:
        from accumguard.observe._imports import when_imported
        from accumguard.observe.invariance_hooks import install_from_env

        when_imported("torch", lambda _torch: install_from_env())
    except Exception as exc:  # noqa: BLE001 - never break the user's program
        print(f"accumguard invariance: seed/dropout hook not installed: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)


try:
    _chain()
finally:
    _start()
