"""Run several watch scripts (or one script with several argument lists) one after the other
in ONE process per rank, each recorded in its own directory by the observation layer
(``accumguard.watch._recording.recording``), as ``accumguard watch -- python SCRIPT ARGS`` would
record it, but paying for the Python, torch and process-group start-up once instead of once per
case (tests/watch_sweep.py starts this and judges the directories as the CLI does).

usage: run_many.py [--local_rank=R] SPEC.json   (the ``deepspeed`` launcher adds --local_rank)
  SPEC: {"out": DIR, "runs": [{"name": NAME, "argv": [SCRIPT, ARG, ...]}, ...]}
  Writes DIR/NAME/rank-<R>.jsonl (the recording) and DIR/_status/NAME.rank<R>.json (the
  script's exit code and its captured stdout/stderr).

Each script runs as ``__main__`` with ``sys.argv = [SCRIPT, ARG, ...]``. Under ``watch``
the observer starts with the interpreter, so the time budget of its conservation checks (1 %
of the time since it started, after the first two windows) includes the Python and torch
start-up; a recording opened here after that start-up would check fewer windows than
``watch`` does. Each recording's clock is therefore set back to this process's start.

Under torchrun the process group is created by the first script and kept: a later
``init_process_group`` is a no-op, ``destroy_process_group()`` waits for the end of the
sweep.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PROCESS_START = time.perf_counter()  # before torch is imported, as under watch


def main() -> None:
    # the deepspeed launcher puts --local_rank=R before the script's own arguments: each
    # script gets it there too, as the launcher would have given it
    launcher_args = [a for a in sys.argv[1:] if a.startswith("--local_rank")]
    spec = json.loads(Path(next(a for a in sys.argv[1:] if a.endswith(".json"))).read_text())
    out = Path(spec["out"])
    status_dir = out / "_status"
    status_dir.mkdir(parents=True, exist_ok=True)

    import torch.distributed as dist

    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group

    def init_once(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            real_init(*args, **kwargs)

    def destroy_at_the_end(group: Any = None) -> None:
        if group is not None:
            real_destroy(group)

    dist.init_process_group = init_once  # type: ignore[assignment]
    dist.destroy_process_group = destroy_at_the_end  # type: ignore[assignment]

    from accumguard.watch._recording import recording

    rank = os.environ.get("RANK", "0")
    try:
        for run in spec["runs"]:
            name, argv = run["name"], [str(a) for a in run["argv"]]
            argv = [argv[0], *launcher_args, *argv[1:]]
            sys.argv = list(argv)
            script_dir = str(Path(argv[0]).resolve().parent)
            if script_dir not in sys.path:
                sys.path.insert(0, script_dir)
            stdout, stderr = io.StringIO(), io.StringIO()
            code: int = 0
            started = time.monotonic()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                try:
                    with recording(out / name) as observer:
                        # the observer's clock, as if it had started with the process (above)
                        assert hasattr(observer, "_t_start"), "Observer._t_start moved"
                        observer._t_start = min(observer._t_start, PROCESS_START)
                        runpy.run_path(argv[0], run_name="__main__")
                except SystemExit as stop:
                    if isinstance(stop.code, int):
                        code = stop.code
                    elif stop.code is not None:
                        print(stop.code, file=sys.stderr)
                        code = 1
                except BaseException:  # noqa: BLE001 - recorded as the script's failure
                    traceback.print_exc()
                    code = 1
            (status_dir / f"{name}.rank{rank}.json").write_text(json.dumps(
                {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                 "seconds": round(time.monotonic() - started, 2)}))
            if dist.is_initialized():
                dist.barrier()
    finally:
        if dist.is_initialized():
            real_destroy()


if __name__ == "__main__":
    main()
