"""The public surface is deliberate: frozen `__all__`, light import, typed package."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import accumguard

EXPECTED = {
    "AccumguardError", "AccumguardWarning", "AccumulationConfig", "AccumulationError",
    "AccumulationGuard", "guard",
    "Accumulator", "Boundary", "ConfigError", "DistributedError", "Engine", "GradReduction",
    "RankFailedError", "RankTimeoutError", "StepResult", "UsageError", "Window", "loss_scale",
    "reference_run", "relative_update_error", "resolve_engine", "run_on_ranks",
    # the products the CLI has: audit, invariance, watch, lint (watch and invariance are
    # packages with their own public names; accumguard.watch can be called like a function)
    "audit", "run_invariance", "InvarianceOptions", "invariance", "watch", "WatchResult",
    "lint_paths",
}


def test_all_is_frozen() -> None:
    assert set(accumguard.__all__) == EXPECTED
    for name in accumguard.__all__:
        assert getattr(accumguard, name) is not None


def test_import_does_not_pull_optional_or_cli_libraries() -> None:
    code = ("import sys, accumguard; "
            "heavy = [m for m in ('deepspeed', 'matplotlib', 'rich', 'accumguard.cli', "
            "'accumguard.static.lint', 'accumguard.demo.demo') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_ships_py_typed() -> None:
    assert (pathlib.Path(accumguard.__file__).parent / "py.typed").exists()


def test_every_error_is_one_hierarchy() -> None:
    from accumguard.core import errors

    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, Exception)]
    assert all(issubclass(c, errors.AccumguardError) for c in classes
               if c.__module__ == errors.__name__ and c is not errors.AccumguardWarning)


def test_moved_module_paths_still_import_with_a_deprecation_warning() -> None:
    """A user's glue written against an old path keeps working for one release and is
    told the new one (``accumguard.contract`` broke without warning when it moved)."""
    import importlib
    import warnings

    from accumguard._moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mod = importlib.import_module(old)
        assert mod is importlib.import_module(new), old
        assert mod.__spec__ is not None and mod.__spec__.name == new, old  # reload() works
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
                   for w in caught), (old, [str(w.message) for w in caught])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from accumguard.contract import __name__ as contract_name  # the reported break
    assert contract_name == "accumguard.verify.contract"


def test_watch_is_a_package_that_can_still_be_called() -> None:
    """``accumguard.watch`` was a function; it is now the product's package. Both old
    spellings (``from accumguard import watch; watch(cmd)`` and ``accumguard.watch(cmd)``)
    still run a command, before and after a submodule import sets the parent's attribute
    (fresh interpreter: the order of first imports is what is tested)."""
    code = """
import sys, warnings
warnings.simplefilter("error")  # none of the spellings below is deprecated
import accumguard
from accumguard import watch
import accumguard.watch._report as report
calls = []
report.watch = lambda command, **kw: calls.append((list(command), kw)) or "result"
assert watch(["python", "a.py"], accumulation_steps=4) == "result"
assert accumguard.watch(["python", "b.py"]) == "result"
import accumguard.watch._recording
assert "torch" not in sys.modules  # the package and the bootstrap's module stay light
import accumguard.watch._findings
assert accumguard.watch is watch and callable(accumguard.watch)
assert accumguard.watch(["python", "c.py"], every=2) == "result"
from accumguard.watch import run, judge, recording, analyze, load_recordings, WatchResult
assert accumguard.WatchResult is WatchResult
print(calls)
"""
    for first in ("", "import accumguard.watch._recording\n"):
        out = subprocess.run([sys.executable, "-c", first + code], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == ("[(['python', 'a.py'], {'accumulation_steps': 4}), "
                                      "(['python', 'b.py'], {}), "
                                      "(['python', 'c.py'], {'every': 2})]"), out.stdout


def test_watch_and_invariance_public_names() -> None:
    import inspect

    import accumguard.invariance
    import accumguard.watch
    from accumguard.watch import _report

    assert accumguard.watch.run is accumguard.watch.watch is _report.watch
    assert "accumulation_steps" in inspect.signature(accumguard.watch).parameters
    for name in accumguard.watch.__all__:
        assert getattr(accumguard.watch, name) is not None, name
    assert accumguard.invariance.run_invariance is accumguard.run_invariance
    assert accumguard.invariance.InvarianceOptions is accumguard.InvarianceOptions
    for name in accumguard.invariance.__all__:
        assert getattr(accumguard.invariance, name) is not None, name


def test_the_project_itself_imports_no_moved_path() -> None:
    """The old paths are for users' code: src, tests, benchmarks and scripts import the
    new ones, so the project raises none of the DeprecationWarnings it hands out."""
    import ast

    from accumguard._moved import MOVED

    root = pathlib.Path(__file__).resolve().parents[1]
    seen = []
    for folder in ("src", "tests", "benchmarks", "scripts"):
        for path in (root / folder).rglob("*.py"):
            if "lint_corpus" in path.parts or path == pathlib.Path(__file__).resolve():
                continue  # (this file imports an old path on purpose, above)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                seen += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                         if n in MOVED]
    assert not seen, "imports of moved paths:\n" + "\n".join(seen)


def test_a_moved_path_warns_at_the_users_import_line(tmp_path: pathlib.Path) -> None:
    """With Python's default filters a DeprecationWarning shows only when attributed to
    ``__main__``: the warning must name the user's line, not a frame of the import system,
    and a private new module points to its package's public names."""
    script = tmp_path / "glue.py"
    script.write_text("import accumguard.runtime.watch_report\n"
                      "from accumguard.verify.invariance import run_invariance\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert (f"{script}:1: DeprecationWarning: accumguard.runtime.watch_report moved to "
            "accumguard.watch._report; a private module: import its public names from "
            "accumguard.watch") in out.stderr, out.stderr
    assert (f"{script}:2: DeprecationWarning: accumguard.verify.invariance moved to "
            "accumguard.invariance; import it from there") in out.stderr, out.stderr
