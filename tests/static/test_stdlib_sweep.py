"""Robustness: ``accumguard lint`` must never crash on valid Python.

Runs the full analysis (no text pre-filter) over every ``.py`` file of the
standard library. Files that are not valid Python for this interpreter (the
stdlib ships a few on purpose, e.g. ``lib2to3`` test data) must come back as a
clean :class:`LintError`, never as another exception. Files over 300 KB are
skipped to keep the sweep within about a minute; they are generated tables, not
code shapes we would otherwise miss. Runs in parallel over the available CPUs.
"""

from __future__ import annotations

import os
import sysconfig
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from accumguard.static.lint import LintError, lint_file

MAX_BYTES = 300_000


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts
        and "dist-packages" not in p.parts
        and p.is_file()
        and p.stat().st_size <= MAX_BYTES
    )


def _lint_chunk(paths: list[str]) -> tuple[int, int, list[str], float]:
    """(files, parse errors, crash reports, CPU seconds) for a chunk; runs in a worker process."""
    cpu = time.process_time()
    errors = 0
    crashes: list[str] = []
    for p in paths:
        try:
            lint_file(p, prefilter=False)
        except LintError as exc:
            assert exc.line >= 1 and exc.col >= 1 and exc.message
            errors += 1
        except Exception:  # noqa: BLE001 - any other exception is the bug we look for
            crashes.append(f"{p}:\n{traceback.format_exc()}")
    return len(paths), errors, crashes, time.process_time() - cpu


@pytest.mark.slow
def test_no_crash_on_stdlib() -> None:
    files = [str(p) for p in _stdlib_files()]
    assert len(files) > 500, "stdlib not found where sysconfig says it is"
    workers = max(1, min(8, os.cpu_count() or 1))
    chunks = [files[i::workers * 4] for i in range(workers * 4)]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_lint_chunk, chunks))
    elapsed = time.perf_counter() - start
    scanned = sum(r[0] for r in results)
    parse_errors = sum(r[1] for r in results)
    crashes = [c for r in results for c in r[2]]
    cpu = sum(r[3] for r in results)
    print(
        f"\nstdlib sweep: {scanned} files, {parse_errors} not valid Python, "
        f"{len(crashes)} crashes, {elapsed:.1f} s wall ({cpu:.1f} s CPU) on {workers} processes"
    )
    assert scanned == len(files)
    assert not crashes, "lint crashed on valid Python:\n" + "\n".join(crashes[:5])
    # the stdlib has only a handful of deliberately invalid files
    assert parse_errors < 30
