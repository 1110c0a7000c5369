"""Module paths that moved, kept importable for one release with a DeprecationWarning.

A user's glue written against an old path (``from accumguard.contract import ...``)
keeps working and is told the new one, instead of breaking on upgrade. The table is the
one place that knows the old layout; remove an entry one release after its move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: old module path -> new module path (moved in 0.1, when the package was split by layer)
MOVED = {
    "accumguard.accumulator": "accumguard.accumulate.accumulator",
    "accumguard.audit": "accumguard.verify.audit",
    "accumguard.cli_audit": "accumguard.cli.audit",
    "accumguard.contract": "accumguard.verify.contract",
    "accumguard.diagnosis": "accumguard.verify.diagnosis",
    "accumguard.dsconfig": "accumguard.static.dsconfig",
    "accumguard.errors": "accumguard.core.errors",
    "accumguard.guard": "accumguard.runtime.guard",
    "accumguard.launch": "accumguard.runtime.launch",
    "accumguard.lint": "accumguard.static.lint",
    "accumguard.lint.catalog": "accumguard.static.findings",
    "accumguard.lint.cli": "accumguard.cli.lint",
    "accumguard.lint.report": "accumguard.static.lint.report",
    "accumguard.loops": "accumguard.demo.loops",
    "accumguard.pytest_plugin": "accumguard.verify.pytest_plugin",
    "accumguard.reference": "accumguard.verify.reference",
    "accumguard.report": "accumguard.cli.report",
    "accumguard.scaling": "accumguard.core.scaling",
    "accumguard.testing": "accumguard.verify.testing",
    "accumguard.toy": "accumguard.demo.toy",
    # moved after 0.1.0, when the products got their own folders (accumguard.watch,
    # accumguard.invariance); the public names are those packages' own
    "accumguard.runtime.watch": "accumguard.watch._recording",
    "accumguard.runtime.watch_declared": "accumguard.watch._declared",
    "accumguard.runtime.watch_findings": "accumguard.watch._findings",
    "accumguard.runtime.watch_report": "accumguard.watch._report",
    "accumguard.verify.invariance": "accumguard.invariance",
    "accumguard.verify._invariance_compare": "accumguard.invariance._compare",
    "accumguard.verify._invariance_options": "accumguard.invariance._options",
    "accumguard.verify._invariance_records": "accumguard.invariance._records",
    "accumguard.verify._invariance_report": "accumguard.invariance._report",
    "accumguard.verify._invariance_run": "accumguard.invariance._run",
    "accumguard.verify._invariance_tolerance": "accumguard.invariance._tolerance",
}


class _Loader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        package, _, last = self.new.rpartition(".")
        where = ("import it from there" if not last.startswith("_") else
                 f"a private module: import its public names from {package}")
        # stacklevel 2: the import system's own frames are skipped, so this names the
        # user's import line (and the default filters show it in a script's __main__)
        warnings.warn(f"{spec.name} moved to {self.new}; {where} (the old path goes away in "
                      "the next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        sys.modules[spec.name] = module
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported: nothing to execute, but the import
        system has just written the old path's spec over the module's own; put it back
        (``importlib.reload`` and ``__spec__.name`` must keep naming the new path)."""
        module.__spec__ = self.spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(new),
                                              is_package=fullname == "accumguard.lint")


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import accumguard`` calls this)."""
    # first: an old submodule of a moved package (accumguard.lint.report) would otherwise be
    # found by the path finder under the new package's __path__ and loaded a second time
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
