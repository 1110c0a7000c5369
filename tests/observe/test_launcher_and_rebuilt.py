"""Two shapes of correct scripts that blind round 35 reported as errors.

* A script's main process spawns the ranks of a 2-process job (``mp.spawn``) and then, on
  its own, trains a single-process large-batch reference. It records under rank 0 as a
  process of one; its steps were merged into rank 0's (F1: one backward per step) and the
  real rank 0 was dropped as "a subprocess of the script". The launcher's steps are set
  apart (counted, said in the report, not judged).
* A run interrupted mid-window (its model and optimizer abandoned), then resumed with a new
  model and optimizer that replay the window: the abandoned backwards are counted into the
  new optimizer's first window, which looked like an epoch tail leaking (F7 error). Nothing
  measured says whose they were: a warning."""

from __future__ import annotations

import json
from pathlib import Path

from accumguard.observe.rules import RunRecording, analyze
from accumguard.watch._findings import load_recordings

K = 4


def _write(path: Path, start: dict[str, object], steps: list[dict[str, object]]) -> None:
    lines = [{"kind": "start", **start}] + [{"kind": "step", "rank": start["rank"], **s}
                                           for s in steps]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _job(tmp: Path, *, parent_world: int) -> Path:
    train = [{"step": i, "backwards": K, "opt_serial": 1, "checksum": [0.5, 0.25, 2.0 + i]}
             for i in range(4)]
    ref = [{"step": i, "backwards": 1, "opt_serial": 1} for i in range(4)]
    _write(tmp / "rank-0.jsonl", {"rank": 0, "world": 2, "pid": 101, "ppid": 100}, train)
    _write(tmp / "rank-1.jsonl", {"rank": 1, "world": 2, "pid": 102, "ppid": 100}, train)
    _write(tmp / "rank-0.pid-100.jsonl",
           {"rank": 0, "world": parent_world, "pid": 100, "ppid": 1}, ref)
    return tmp


def test_the_spawning_process_reference_is_not_rank_zero(tmp_path: Path) -> None:
    rec = load_recordings(_job(tmp_path, parent_world=1))
    assert rec.outside_steps == 4
    assert sorted(rec.steps) == [0, 1]
    assert [int(s["backwards"]) for s in rec.steps[0]] == [K] * 4  # the spawned rank 0's
    found = analyze(rec, k_flag=K)[0]
    assert [f for f in found if f.severity.value == "error"] == [], found


def test_a_subprocess_of_a_rank_is_still_not_the_rank(tmp_path: Path) -> None:
    """The same files, the parent a rank of the 2-process job (world 2): its child under
    the same rank number is the script's subprocess, left out as before."""
    rec = load_recordings(_job(tmp_path, parent_world=2))
    assert rec.outside_steps == 0
    assert rec.children == 1
    assert [int(s["backwards"]) for s in rec.steps[0]] == [1] * 4


def _resumed(abandoned: int, serial_after: int) -> RunRecording:
    """Windows of K; then ``abandoned`` backwards whose optimizer never steps again (the run
    interrupted mid-window), counted into the next optimizer object's first window."""
    first = [{"step": i, "backwards": K, "opt_serial": 1} for i in range(3)]
    resumed = [{"step": 3, "backwards": abandoned + K, "opt_serial": serial_after}]
    resumed += [{"step": 4 + i, "backwards": K, "opt_serial": serial_after} for i in range(4)]
    return RunRecording(steps={0: first + resumed})


def test_backwards_before_a_rebuilt_optimizer_first_step_are_a_warning() -> None:
    found = analyze(_resumed(3, serial_after=2), k_flag=K)[0]
    assert [f for f in found if f.severity.value == "error"] == [], found
    assert any(f.cls == "F7" and f.severity.value == "warning" for f in found), found


def test_the_same_long_window_from_one_optimizer_is_still_a_leak() -> None:
    found = analyze(_resumed(3, serial_after=1), k_flag=K)[0]
    assert any(f.cls == "F7" and f.severity.value == "error" for f in found), found


def test_a_reference_subprocess_beside_the_spawned_ranks_is_set_apart(tmp_path: Path) -> None:
    """The main process records nothing (it only spawns); its ranks (world 2) and a
    reference subprocess (a process of one, recording under rank 0 too) are siblings: two
    processes cannot both be rank 0 of the job (blind round 36 a_c03)."""
    train = [{"step": i, "backwards": K, "opt_serial": 1, "checksum": [0.5, 0.25, 2.0 + i]}
             for i in range(3)]
    ref = [{"step": i, "backwards": 1, "opt_serial": 1} for i in range(3)]
    _write(tmp_path / "rank-0.jsonl", {"rank": 0, "world": 2, "pid": 201, "ppid": 200}, train)
    _write(tmp_path / "rank-1.jsonl", {"rank": 1, "world": 2, "pid": 202, "ppid": 200}, train)
    _write(tmp_path / "rank-0.pid-203.jsonl", {"rank": 0, "world": 1, "pid": 203, "ppid": 200},
           ref)
    rec = load_recordings(tmp_path)
    assert rec.outside_steps == 3 and sorted(rec.steps) == [0, 1]
    assert [int(s["backwards"]) for s in rec.steps[0]] == [K] * 3
    assert [f for f in analyze(rec, k_flag=K)[0] if f.severity.value == "error"] == []
