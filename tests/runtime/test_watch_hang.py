"""``accumguard watch`` names, per rank, the collective a failed run was stuck in.

A real 2-rank torchrun script (tests/watch_scripts/hang_skip.py) where rank 0 skips one
all_reduce: rank 1 waits in it until the 5 s gloo process-group timeout (rank 0 hangs
elsewhere and is ended by the launcher's SIGTERM) or until rank 0 exits. The report must
say which rank waited in which collective and where (call, step, micro-step), and what
the other rank last finished. The counter's bookkeeping is checked without a spawn.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accumguard.observe._collectives import CollectiveCounter

from helpers import free_port, launcher_env

SCRIPTS = Path(__file__).resolve().parents[1] / "watch_scripts"


def test_counter_keeps_the_open_and_the_failed_collective() -> None:
    counter = CollectiveCounter(lambda op, reduces: None)
    counter.position = lambda: (2, 1, False)

    def ok() -> int:
        return 1

    def times_out() -> None:
        raise RuntimeError("Timed out waiting 5000ms")

    counter._counting("broadcast", False)(ok)()
    state = counter.state()
    assert state["open"] is None and state["failed"] is None
    assert state["last_done"] == {"op": "broadcast", "call": 1, "step": 2, "micro": 1,
                                  "in_backward": False}
    with pytest.raises(RuntimeError):
        counter._counting("all_reduce", True)(times_out)()
    state = counter.state()
    assert state["open"]["op"] == "all_reduce" and state["open"]["call"] == 1
    assert "Timed out" in state["failed"]["error"]
    assert state["last_done"]["op"] == "broadcast"
    assert state["calls"] == {"broadcast": 1, "all_reduce": 1}


@pytest.mark.parametrize("then", ["sleep", "exit"])
def test_watch_names_the_rank_and_the_collective(tmp_path: Path, then: str) -> None:
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "accumguard.cli", "watch", "--json", str(report), "--",
               sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               str(SCRIPTS / "hang_skip.py"), "--then", then]
    proc = subprocess.run(command, env=launcher_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    data = json.loads(report.read_text())
    problems = data["problems"]
    waiting = [p for p in problems if p.startswith("rank 1 was waiting in all_reduce")]
    assert waiting, problems
    assert "(call 6, step 3, micro-step 2)" in waiting[0]
    assert "raised" in waiting[0]  # the timeout / the peer's exit, as torch said it
    assert "rank 0 last finished all_reduce (call 5, step 3, micro-step 1)" in problems
    assert any("rank 0 5, rank 1 6" in p for p in problems), problems
    assert "rank 1 was waiting in all_reduce" in proc.stderr
