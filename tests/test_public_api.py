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
    # the products the CLI has, as functions: audit, invariance, watch, lint
    "audit", "run_invariance", "InvarianceOptions", "watch", "WatchResult", "lint_paths",
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
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
                   for w in caught), (old, [str(w.message) for w in caught])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from accumguard.contract import __name__ as contract_name  # the reported break
    assert contract_name == "accumguard.verify.contract"
