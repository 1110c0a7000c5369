"""Shared test setup: isolate every test from a surrounding torchrun/elastic job."""

from __future__ import annotations

import getpass
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

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
    if importlib.util.find_spec("deepspeed") is not None and not hasattr(
            session.config, "workerinput"):
        _build_deepspeed_op_once()


def _build_deepspeed_op_once() -> None:
    """Compile DeepSpeed's CPU comm op before any test starts (in the xdist controller, before
    the workers exist). Otherwise the first DeepSpeed tests of a fresh venv compile it while
    the others wait on its lock, and the compile (50-380 s quiet, far longer on a loaded
    machine) counts against their launch timeouts: a CI run on a loaded machine lost a
    900 s sweep and a 600 s advise run that way (2026-12-06). A failed build is not fatal
    here: the tests build it again and report their own failure."""
    import subprocess

    so = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"
    if so.exists():
        return
    print(f"\nbuilding DeepSpeed's CPU comm op once, before the tests (into {so.parent})",
          file=sys.stderr, flush=True)
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=1800, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    except subprocess.TimeoutExpired:
        print("the DeepSpeed op did not build within 1800 s; the tests will try again",
              file=sys.stderr)
        return
    if proc.returncode != 0 or not so.exists():
        print(f"the DeepSpeed op did not build (exit {proc.returncode}); the tests will try "
              f"again:\n{proc.stderr[-2000:]}", file=sys.stderr)


def _scope(nodeid: str) -> str:
    """The unit ``--dist loadfile`` hands to one worker: the test's module, or the group of
    modules that share the session-wide DeepSpeed spawn (``ds_spawn.WORKERS``)."""
    from ds_spawn import TORCH_WORKERS, WORKERS

    path = nodeid.split("::", 1)[0]
    if Path(path).stem in TORCH_WORKERS:
        return "torch-spawn"
    return "deepspeed-spawn" if Path(path).stem in WORKERS else path


#: Seconds of the heaviest units: the module times ("slowest 30 test modules") of a quiet
#: ``.ci/run`` of main 4f2b311 (2026-12-02 15:17 UTC: 1,573 s of tests, 13 min 37 s), the
#: units changed since then estimated (marked). xdist 3.8's loadscope hands each worker one
#: unit and the next one when <= 2 of its tests are pending, in the collection's order:
#: listed units go first, heaviest first, so that a long unit never starts near the end
#: (test_invariance_precision_runs, 52 s in 5 tests, was unlisted and could start last);
#: the light many-test modules fill the end and the two workers end closer together. The
#: rest keep xdist's order (most tests first). Only the order changes: every test runs, each
#: module whole in one worker.
_SCOPE_SECONDS: dict[str, float] = {
    "tests/runtime/test_advise.py": 152,
    "tests/integrations/test_deepspeed_frameworks.py": 140,  # est.: the invariance CLI in-process
    "tests/runtime/test_watch_features.py": 93,
    "deepspeed-spawn": 90,  # est.: the DeepSpeed engine modules, test_checkpoint, test_audit
    "torch-spawn": 80,  # est.: 12 modules' 2-rank workers in one spawn (ds_spawn.TORCH_WORKERS)
    "tests/runtime/test_watch.py": 73,
    "tests/runtime/test_failsafe_stacks.py": 66,
    "tests/verify/test_invariance_scripts.py": 50,  # est. (61 s with the CLI launched)
    "tests/runtime/test_launch.py": 51,
    "tests/demo/test_demo_story.py": 51,
    "tests/runtime/test_signals.py": 46,
    "tests/verify/test_invariance_precision_runs.py": 45,  # est. (52 s with the CLI launched)
    "tests/runtime/test_watch_precision.py": 38,
    "tests/runtime/test_watch_multinode.py": 32,
    "tests/verify/test_invariance_rl.py": 29,  # est. (34 s with the CLI launched)
    "tests/runtime/test_watch_hang.py": 27,
    "tests/demo/test_bench.py": 25,
    "tests/verify/test_plugin.py": 25,
    "tests/cli/test_cli.py": 23,
    "tests/accumulate/test_multinode.py": 22,
    "tests/static/test_robustness.py": 21,
    "tests/runtime/test_guard_watch_catalogue.py": 20,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the listed units first, heaviest first, then the others by their
    number of tests (xdist's own order). A stable sort: the order inside a unit is pytest's.
    Every worker sorts the same collection the same way, as xdist requires."""
    if not hasattr(config, "workerinput"):
        return
    scopes = [_scope(item.nodeid) for item in items]
    count: dict[str, int] = {}
    for scope in scopes:
        count[scope] = count.get(scope, 0) + 1
    key = {id(item): (-_SCOPE_SECONDS.get(scope, 0.0), -count[scope])
           for item, scope in zip(items, scopes, strict=True)}
    items.sort(key=lambda item: key[id(item)])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist's ``--dist loadfile``: each test module runs whole in one worker (its
    module-scoped launches run once), and the modules that share the session-wide DeepSpeed
    spawn (``ds_spawn.WORKERS``) run together in one worker, so that spawn runs once too.
    The units are handed out in the collection's order (longest first, see
    :func:`pytest_collection_modifyitems`), not by their number of tests."""
    if config.getoption("dist", "no") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist >= 3.6: keep the collection's order

    class _ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return _ByModule(config, log)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def deepspeed_spawn(request: pytest.FixtureRequest) -> dict[str, list[object]]:
    """The DeepSpeed engine modules' workers, run in ONE 2-rank spawn (tests/ds_spawn.py):
    module name -> its worker's per-rank results."""
    pytest.importorskip("deepspeed")
    from ds_spawn import shared_deepspeed_spawn

    return shared_deepspeed_spawn(request.session)


@pytest.fixture
def accumguard_cli(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> Any:
    """``accumguard_cli(*argv, env=None)`` -> (exit code, stdout, stderr): ``accumguard
    ARGV`` run through the CLI's entry point (``accumguard.cli.main``) in this process,
    with ``env`` as the whole environment (default: a launched CLI's,
    ``helpers.launcher_env``), restored afterwards. The output is captured at the file
    descriptors, so the commands the CLI starts (whose output passes through) are in it,
    as they are in a launched CLI's. For the tests whose subject is the subcommand, not
    the ``python -m accumguard.cli`` process around it: that process costs one more Python
    start, and ``invariance``'s or ``advise``'s one more ``import torch`` too (about 2.5 s
    of CPU each); the process boundary itself keeps real launches elsewhere (e.g.
    runtime/test_advise.py's DDP run, verify/test_invariance_scripts.py's failing
    command)."""
    from accumguard.cli import main

    from helpers import launcher_env

    def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        want = launcher_env() if env is None else dict(env)
        for key in set(os.environ) - set(want):
            monkeypatch.delenv(key)
        for key, value in want.items():
            monkeypatch.setenv(key, value)
        capfd.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        printed = capfd.readouterr()
        return code, printed.out, printed.err

    return run


@pytest.fixture(scope="session")
def torch_spawn(request: pytest.FixtureRequest) -> dict[str, list[object]]:
    """The torch-only 2-rank (gloo) workers of tests/accumulate in ONE spawn
    (``ds_spawn.TORCH_WORKERS``): module name -> its worker's per-rank results."""
    from ds_spawn import shared_torch_spawn

    return shared_torch_spawn(request.session)


# Seconds per test module (setup + call + teardown of its tests, summed over workers), so
# that every run's log says where the suite's time goes, module by module.
_MODULE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + float(report.duration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _MODULE_SECONDS or hasattr(terminalreporter.config, "workerinput"):
        return
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest 30 test modules (of {len(_MODULE_SECONDS)}; "
                                    f"{total:.0f} s of tests in all)")
    for module, secs in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1])[:30]:
        terminalreporter.write_line(f"{secs:8.1f}s  {module}")
