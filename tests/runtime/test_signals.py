"""A cancelled run leaves nothing behind: SIGTERM/SIGHUP/SIGINT to the parent of
``accumguard demo``, ``audit``, ``curves`` and ``bench`` ends every rank it spawned (and
everything those started) within 5 s, and the parent dies of the signal it got.

Each command is started for real, in its own session; once its ranks exist (processes
that made themselves process-group leaders under the parent), the parent alone gets the
signal, and every process of the command's tree (and of the ranks' groups) is checked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
AUDIT_FILE = TESTS / "cli" / "test_cli_audit.py"


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgrp, state) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), fields[0]


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _tree(root: int) -> set[int]:
    """Every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] != "Z"


def _in_groups(groups: set[int]) -> set[int]:
    found = set()
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None and st[1] in groups and st[2] != "Z":
            found.add(pid)
    return found


def _terminate_and_check(cmd: list[str], sig: int = signal.SIGTERM,
                         ranks: int = 2, start_timeout: float = 240.0) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True, cwd=TESTS.parent)
    rank_groups: set[int] = set()
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            seen |= _tree(parent.pid)
            # Ranks make themselves process-group leaders (pgrp == pid).
            rank_groups = {p for p in seen if (st := _stat(p)) is not None and st[1] == p}
            if len(rank_groups) >= ranks or parent.poll() is not None:
                break
            time.sleep(0.2)
        assert parent.poll() is None, (
            f"{cmd} ended before its ranks started: {parent.stderr.read().decode()[-2000:]}")
        assert len(rank_groups) >= ranks, f"{cmd}: no ranks seen after {start_timeout} s"
        time.sleep(1.0)  # the ranks are now busy (importing torch, joining the rendezvous)
        seen |= _tree(parent.pid)
        parent.send_signal(sig)
        time.sleep(5.0)
        left = {p for p in seen if _alive(p)} | _in_groups(rank_groups)
        left.discard(parent.pid)
        assert not left, f"{cmd}: processes left 5 s after {signal.Signals(sig).name}: {left}"
        code = parent.wait(timeout=5)
        assert code != 0, f"{cmd}: exit code {code} after {signal.Signals(sig).name}"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(parent.pid, signal.SIGKILL)
        for g in rank_groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, signal.SIGKILL)
        with contextlib.suppress(Exception):
            parent.wait(timeout=5)


CLI = [sys.executable, "-m", "accumguard.cli"]


@pytest.mark.parametrize(("name", "args", "sig"), [
    ("demo", ["demo", "--quick", "--no-plot", "--out", "{tmp}"], signal.SIGTERM),
    ("audit", ["audit", f"{AUDIT_FILE}:make_setup", f"{AUDIT_FILE}:good_loop", "--no-progress"],
     signal.SIGHUP),
    ("curves", ["curves", "--no-plot", "--out", "{tmp}"], signal.SIGTERM),
    ("bench", ["bench", "--quick", "--no-deepspeed"], signal.SIGINT),
])
def test_signal_to_the_parent_ends_every_rank(name: str, args: list[str], sig: int,
                                              tmp_path: Path) -> None:
    _terminate_and_check(CLI + [a.replace("{tmp}", str(tmp_path)) for a in args], sig)
