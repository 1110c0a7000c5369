"""``accumguard watch`` as a library: run a command with every rank observed, and judge it.

The documented spelling::

    from accumguard import watch

    result = watch.run(["torchrun", "--nproc-per-node", "2", "train.py"],
                       accumulation_steps=4)          # what `accumguard watch -- CMD` does
    [f.cls for f in result.errors]
    result = watch.judge("records/")                  # a recording left by an earlier run

    with watch.recording("out/"):                     # observe a block of this process
        train_some_steps()
    findings, k, where = watch.analyze(watch.load_recordings("out/"))

``watch(command, ...)`` (the module called like a function) is ``watch.run(command, ...)``:
``accumguard.watch`` was a function before it became this package, and user code calling it
keeps working, with or without a warning. Every name below is imported on first use, so
the bootstrap that every process of a watched command imports stays light (no torch).

Layout (private modules): ``_recording`` (the bootstrap's agent in each process, the
per-rank recording and :func:`observed_env`, the child's environment), ``_bootstrap/``
(the ``sitecustomize`` put first on the child's ``PYTHONPATH``), ``_declared`` (the K the
command's script declares, read by ``ast``), ``_findings`` (recordings to findings with the
rules of :mod:`accumguard.observe.rules`), ``_report`` (run and judge: one report layout and
exit-code policy; the CLI, :mod:`accumguard.cli.watch`, only parses and prints).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

# public name -> (private module, name there)
_EXPORTS = {
    "run": ("_report", "watch"),
    "watch": ("_report", "watch"),  # `from accumguard.watch import watch`: the same function
    "judge": ("_report", "judge"),
    "WatchResult": ("_report", "WatchResult"),
    "EXIT_ACCUMGUARD_FAILED": ("_report", "EXIT_ACCUMGUARD_FAILED"),
    "JSON_SCHEMA_VERSION": ("_report", "JSON_SCHEMA_VERSION"),
    "recording": ("_recording", "recording"),
    "observed_env": ("_recording", "observed_env"),
    "BOOTSTRAP_DIR": ("_recording", "BOOTSTRAP_DIR"),
    "analyze": ("_findings", "analyze"),
    "load_recordings": ("_findings", "load_recordings"),
    "RunRecording": ("_findings", "RunRecording"),
    "declared_k": ("_declared", "declared_k"),
    "ScriptK": ("_declared", "ScriptK"),
}

__all__ = ["BOOTSTRAP_DIR", "EXIT_ACCUMGUARD_FAILED", "JSON_SCHEMA_VERSION", "RunRecording",
           "ScriptK", "WatchResult", "analyze", "declared_k", "judge", "load_recordings",
           "observed_env", "recording", "run", "watch"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from accumguard.watch._declared import ScriptK, declared_k
    from accumguard.watch._findings import RunRecording, analyze, load_recordings
    from accumguard.watch._recording import BOOTSTRAP_DIR, observed_env, recording
    from accumguard.watch._report import (
        EXIT_ACCUMGUARD_FAILED,
        JSON_SCHEMA_VERSION,
        WatchResult,
        judge,
        watch,
    )
    from accumguard.watch._report import watch as run

    class _Face:
        """What a type checker sees as ``accumguard.watch`` (the parent package declares its
        attribute so): the module's public names and its call, which :class:`_CallableModule`
        implements at run time. Without it a checker would see either a function without
        ``.run``/``.judge`` or a module that cannot be called."""

        __call__ = staticmethod(watch)
        run = staticmethod(watch)
        watch = staticmethod(watch)
        judge = staticmethod(judge)
        recording = staticmethod(recording)
        observed_env = staticmethod(observed_env)
        analyze = staticmethod(analyze)
        load_recordings = staticmethod(load_recordings)
        declared_k = staticmethod(declared_k)
        WatchResult = WatchResult
        RunRecording = RunRecording
        ScriptK = ScriptK
        BOOTSTRAP_DIR = BOOTSTRAP_DIR
        EXIT_ACCUMGUARD_FAILED = EXIT_ACCUMGUARD_FAILED
        JSON_SCHEMA_VERSION = JSON_SCHEMA_VERSION


def __getattr__(name: str) -> Any:
    if name == "__signature__":  # inspect.signature(accumguard.watch): run's own keywords
        import inspect

        return inspect.signature(__getattr__("run"))
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where[0]}"), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


class _CallableModule(types.ModuleType):
    """This package's module type: calling it runs :func:`run` (see the module docstring)."""

    def __call__(self, command: Sequence[str], /, **options: Any) -> WatchResult:
        from accumguard.watch._report import watch as run_watch

        return run_watch(command, **options)


sys.modules[__name__].__class__ = _CallableModule
