"""accumguard's bootstrap: observe this process when ``ACCUMGUARD_OBSERVE_DIR`` is set.

Put first on ``PYTHONPATH`` by :func:`accumguard.watch._recording.observed_env`. Python
imports only the first ``sitecustomize`` it finds, so this one then runs the next
one on the path (the environment's own), if any. It never imports torch.
"""

import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_accumguard_chained_sitecustomize",
                                                          path)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


def _start() -> None:
    if not os.environ.get("ACCUMGUARD_OBSERVE_DIR"):
        return
    try:
        from accumguard.watch._recording import start_agent

        start_agent()
    except Exception as exc:  # noqa: BLE001 - never break the user's program
        print(f"accumguard: observation not installed: {type(exc).__name__}: {exc}",
              file=sys.stderr)


try:
    _chain()
finally:
    _start()
