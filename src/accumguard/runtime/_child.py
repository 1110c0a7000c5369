"""The one way accumguard runs a user's command: in its own process group, its output
passed through untouched, SIGINT/SIGTERM sent to us forwarded to the whole group, an
optional timeout, and nothing it started left alive afterwards (torchrun's ranks outlive
their launcher when it is killed alone). ``watch``, ``invariance`` and ``advise`` use it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ChildExit", "run_group"]


@dataclass(frozen=True)
class ChildExit:
    """How the command ended. ``code``: its exit code, ``128 + N`` when signal N ended it
    (as a shell says), 127/126 when it could not be started; ``signal``: the signal's name
    when one ended it or was forwarded to it; ``timed_out``: killed after ``timeout``."""

    code: int
    signal: str | None
    seconds: float
    timed_out: bool = False
    start_error: str | None = None
    #: SIGINT/SIGTERM reached *us* while it ran (and was forwarded to its group)
    interrupted: bool = False


def run_group(argv: Sequence[str], env: dict[str, str] | None = None, *,
              timeout: float | None = None, grace: float = 5.0) -> ChildExit:
    """Run ``argv`` to its end (or ``timeout`` seconds) in a new process group."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), env=env, start_new_session=True)
    except FileNotFoundError as exc:
        return ChildExit(127, None, 0.0, start_error=f"command not found: {argv[0]!r} ({exc})")
    except PermissionError as exc:
        return ChildExit(126, None, 0.0, start_error=f"command not executable: {argv[0]!r} "
                                                     f"({exc})")
    received: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        _signal_group(proc.pid, signum)

    main = threading.current_thread() is threading.main_thread()
    old = ({s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if main
           else {})
    timed_out = False
    code = 0
    try:
        deadline = None if timeout is None else t0 + timeout
        while True:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                code = proc.wait(timeout=left)
                break
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_group(proc, grace)
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - SIGINT is forwarded above
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        # normal end, timeout or a signal: nothing the command started may survive it
        if received:
            _wait_group(proc.pid, grace)
        _signal_group(proc.pid, signal.SIGKILL)
    name = None
    if code < 0:
        name = signal.Signals(-code).name
        code = 128 - code
    elif received:
        name = signal.Signals(received[0]).name
    return ChildExit(code, name, time.monotonic() - t0, timed_out=timed_out,
                     interrupted=bool(received))


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(pgid, signum)


def _wait_group(pgid: int, grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError, OSError):
            return
        time.sleep(0.1)


def _stop_group(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the group (torchrun forwards it to its ranks), then SIGKILL."""
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    _signal_group(proc.pid, signal.SIGKILL)
