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
