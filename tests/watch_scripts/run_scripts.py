"""Run several scripts that record themselves (``--sweep DIR``) one after the other in ONE
process per rank, paying for the Python, torch, DeepSpeed, Accelerate and process-group
start-up once instead of once per script.

usage: run_scripts.py SCRIPT ARG ... -- SCRIPT ARG ... [-- ...]

Each script runs as ``__main__`` with its own ``sys.argv``. Under torchrun the first
``init_process_group`` creates the process group and later ones are no-ops;
``destroy_process_group()`` is left to the end (and then to the interpreter's exit). A script that fails stops
the run with its traceback and exit code 1 (the test then says which one).
Unlike ``run_many.py`` this opens no recording: the scripts record their own scenarios.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any


def _scripts(argv: list[str]) -> list[list[str]]:
    runs: list[list[str]] = [[]]
    for a in argv:
        if a == "--":
            runs.append([])
        else:
            runs[-1].append(a)
    return [r for r in runs if r]


def main() -> None:
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
    try:
        for argv in _scripts(sys.argv[1:]):
            sys.argv = list(argv)
            script_dir = str(Path(argv[0]).resolve().parent)
            if script_dir not in sys.path:
                sys.path.insert(0, script_dir)
            print(f"run_scripts: {' '.join(argv)}", file=sys.stderr, flush=True)
            runpy.run_path(argv[0], run_name="__main__")
            if dist.is_initialized():
                dist.barrier()
    finally:
        if dist.is_initialized():
            # every rank is done with the group; it is left to the interpreter's exit: under
            # load, gloo's destroy_process_group right after the last collective sometimes
            # aborts the process ("terminate called without an active exception", SIGABRT)
            # after all the work is done (torch 2.13 on CPU, seen with and without accumguard)
            dist.barrier()


if __name__ == "__main__":
    main()
