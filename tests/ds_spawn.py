"""One 2-rank DeepSpeed spawn shared by the modules that build DeepSpeed engines (the engine
modules, accumulate/test_checkpoint.py and verify/test_audit.py).

Each of these modules used to spawn its own two ranks, and each spawn paid Python, torch and
DeepSpeed's import plus ``init_distributed`` again (15-60 s on this machine) for a few seconds
of engine work. :func:`shared_deepspeed_spawn` runs the workers of every such module selected
in the session one after the other in the SAME two ranks, once per session, and hands each
module its own per-rank results (the values its own ``run_on_ranks`` call returned).

A worker that raises fails the spawn, and so every module's tests in it (as a rank failure
always did); the workers run in the order below, each seeding its own model and data.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

#: module name (as pytest imports it) -> the worker function its fixture spawned, in run order
WORKERS: dict[str, str] = {
    "test_deepspeed": "_all_deepspeed",
    "test_deepspeed_lean_flush": "_worker",
    "test_deepspeed_window_memory": "_worker",
    "test_deepspeed_wrappers": "_run",
    "test_nonfinite_dist": "_ds_sweep",
    "test_audit": "_ds_in_place",  # tests/verify: the demo's DeepSpeed loops audited
    "test_checkpoint": "_shared",  # tests/accumulate: DDP, FSDP2, ZeRO 1-3 checkpoint + resume
}
#: each worker's own spawn timeout (s): the shared spawn gets the sum of the selected ones,
#: at most MAX_TIMEOUT (all five took 387 s at load 18-24; a hang should not cost an hour)
TIMEOUTS = {"test_deepspeed": 600, "test_deepspeed_lean_flush": 900,
            "test_deepspeed_window_memory": 600, "test_deepspeed_wrappers": 600,
            "test_nonfinite_dist": 900, "test_audit": 900, "test_checkpoint": 900}
MAX_TIMEOUT = 1800

#: The same for the torch-only 2-rank spawns of tests/accumulate (DDP on gloo, no DeepSpeed):
#: four module fixtures, four spawns before (each two Python + torch starts and a gloo
#: rendezvous), now one, in its own xdist unit (``torch-spawn``) so that it does not lengthen
#: the DeepSpeed unit. integrations/test_trl_peft.py's 2-rank SFT run (a Trainer over gloo)
#: joins it, after the accumulate workers' bitwise comparisons. Seven more modules' module-scoped
#: spawns (torch only: DDP, FSDP2, ZeRO-1 on gloo; the audit, diagnosis, guard-vs-watch and
#: checks-ledger workers) joined it too (issue 24): each was two more Python + torch starts
#: and a rendezvous for a few seconds of work. Left out on purpose: test_guard_ddp (its
#: worker makes one rank's accumguard fail mid-window, leaving the group's collectives to
#: the check's own recovery) and the framework workers that keep process-wide state
#: (Accelerate's, Lightning's). In run order: test_accumulator_errors last, its uneven-ranks
#: check ends with both ranks raising in a window.
TORCH_WORKERS: dict[str, str] = {
    "test_equivalence_local_ddp": "_every_ddp_run",
    "test_master_weights": "_ddp_worker_shared",
    "test_fp32_accumulation": "_local_and_ddp",
    "test_fsdp2": "_fsdp2_shared",
    "test_fsdp2_fast_window": "_grid",
    "test_zero1": "_zero1_shared",
    "test_checks_ledger": "_all",
    "test_guard_watch_agree": "_ddp_rank",
    "test_diagnosis": "_in_place",
    "test_audit_mechanisms": "_in_place",
    "test_trl_peft": "_sft_rank_shared",
    "test_accumulator_errors": "_in_a_group",
}
TORCH_TIMEOUTS = {"test_equivalence_local_ddp": 600, "test_master_weights": 600,
                  "test_fp32_accumulation": 180, "test_fsdp2": 300,
                  "test_fsdp2_fast_window": 300, "test_zero1": 300, "test_checks_ledger": 600,
                  "test_guard_watch_agree": 300, "test_diagnosis": 300,
                  "test_audit_mechanisms": 600, "test_trl_peft": 600,
                  "test_accumulator_errors": 300}


def _run_workers(rank: int, world: int, modules: list[str],
                 workers: dict[str, str] | None = None) -> dict[str, Any]:
    """In each rank: every selected module's worker, as its own spawn would have called it."""
    table = WORKERS if workers is None else workers
    return {m: getattr(importlib.import_module(m), table[m])(rank, world) for m in modules}


def selected(session: pytest.Session, workers: dict[str, str] | None = None) -> list[str]:
    """The modules of :data:`WORKERS` (or ``workers``) that have a test selected in this
    session, in order."""
    names = {item.module.__name__ for item in session.items
             if isinstance(item, pytest.Function) and item.module is not None}
    return [m for m in (WORKERS if workers is None else workers) if m in names]


def shared_deepspeed_spawn(session: pytest.Session) -> dict[str, list[Any]]:
    """module -> [rank 0's result, rank 1's result] of its worker, from one spawn."""
    from accumguard import run_on_ranks

    modules = selected(session)
    per_rank = run_on_ranks(_run_workers, 2, (modules,),
                            timeout=min(MAX_TIMEOUT, sum(TIMEOUTS[m] for m in modules)),
                            env={"DS_ACCELERATOR": "cpu"})
    return {m: [r[m] for r in per_rank] for m in modules}


def shared_torch_spawn(session: pytest.Session) -> dict[str, list[Any]]:
    """module -> [rank 0's result, rank 1's result] of its :data:`TORCH_WORKERS` worker, from
    one 2-rank gloo spawn (no DeepSpeed imported)."""
    from accumguard import run_on_ranks

    modules = selected(session, TORCH_WORKERS)
    per_rank = run_on_ranks(_run_workers, 2, (modules, TORCH_WORKERS),
                            timeout=min(MAX_TIMEOUT, sum(TORCH_TIMEOUTS[m] for m in modules)))
    return {m: [r[m] for r in per_rank] for m in modules}
