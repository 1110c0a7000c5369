"""Shared test setup: isolate every test from a surrounding torchrun/elastic job."""

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Tests live in sub-folders mirroring the package; they share tests/helpers.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Count DDP's gradient all-reduces in every test (the counting comm hook is off by default in
# production; see accumguard.engines.ddp). Set here so that spawned ranks inherit it.
os.environ.setdefault("ACCUMGUARD_COUNT_COLLECTIVES", "1")

# DeepSpeed JIT-builds its CPU shared-memory op (deepspeed_shm_comm) in every process that
# starts its comm (every test that builds an engine). torch keeps one build per
# TORCH_EXTENSIONS_DIR and rebuilds it whenever the build's command line differs, which it
# does between two virtual environments (their include paths): CI's fresh venv and a
# developer's venv sharing ~/.cache/torch_extensions rebuilt it in turn, each build 50-380 s
# of compiling while every DeepSpeed test of every run waited on its lock (measured
# 2026-12-02, docs/dev/test-speed.md). One build directory per interpreter prefix: built
# once per venv, never invalidated by another. Spawned ranks and launched scripts inherit it.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(
    os.path.expanduser("~"), ".cache", "torch_extensions",
    "accumguard-tests-" + hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]))

# Every temporary file of the suite, of its spawned ranks and of the commands it launches
# (torchrun's torchelastic_* folders, trainers' output_dir, recordings) goes under one folder
# removed when the session ends: a run left ~16 GB in /tmp before (2026-12-02). The compile
# cache keeps its usual place so compiled-model tests do not recompile on every run.
_TMP_PARENT = tempfile.gettempdir()
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    _TMP_PARENT, f"torchinductor_{getpass.getuser()}"))
_SESSION_TMP = tempfile.mkdtemp(prefix="accumguard-tests-", dir=_TMP_PARENT)
os.environ["TMPDIR"] = _SESSION_TMP
tempfile.tempdir = _SESSION_TMP


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


_LEAKY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _clean_dist_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key in _LEAKY or key.startswith("TORCHELASTIC_"):
            monkeypatch.delenv(key, raising=False)


def pytest_sessionstart(session: pytest.Session) -> None:
    """DeepSpeed is part of the ``dev`` extra: its tests must run, never be skipped silently.
    Set ACCUMGUARD_ALLOW_NO_DEEPSPEED=1 to run the rest of the suite without it on purpose."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None and not os.environ.get(
            "ACCUMGUARD_ALLOW_NO_DEEPSPEED"):
        raise pytest.UsageError(
            "deepspeed is not installed, so the DeepSpeed tests would be skipped; install the "
            "dev extra (pip install -e '.[dev]') or set ACCUMGUARD_ALLOW_NO_DEEPSPEED=1")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist's ``--dist loadfile``: each test module runs whole in one worker (its
    module-scoped launches run once), and the modules that share the session-wide DeepSpeed
    spawn (``ds_spawn.WORKERS``) run together in one worker, so that spawn runs once too."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from ds_spawn import WORKERS
    from xdist.scheduler import LoadScopeScheduling

    class _ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "deepspeed-spawn" if Path(path).stem in WORKERS else path

    return _ByModule(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def deepspeed_spawn(request: pytest.FixtureRequest) -> dict[str, list[object]]:
    """The DeepSpeed engine modules' workers, run in ONE 2-rank spawn (tests/ds_spawn.py):
    module name -> its worker's per-rank results."""
    pytest.importorskip("deepspeed")
    from ds_spawn import shared_deepspeed_spawn

    return shared_deepspeed_spawn(request.session)
