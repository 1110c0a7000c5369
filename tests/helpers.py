"""Shared pieces of the equivalence tests: a grid case, its data, its reference, its errors.

Workers (run on real ranks via :func:`accumguard.run_on_ranks`) train and return
parameter snapshots; the parent process computes the independent single-process
reference and the relative update errors. Engine tests reuse all of this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from accumguard.demo.toy import TokenMLP, make_rank_batches, token_loss
from accumguard.verify.reference import (
    ReferenceRun,
    reference_run,
    relative_update_error,
    windows_for_reference,
)

# fp32 target vs fp64 reference, relative to the update: the mission's criterion.
FP32_UPDATE_TOL = 1e-5
# A broken loop must be off by at least this much for the comparison to mean anything.
BROKEN_MIN_ERROR = 1e-2


@dataclass(frozen=True)
class Case:
    """One point of the equivalence grid."""

    accumulation_steps: int = 4
    micro_batches: int = 8  # per rank; not a multiple of K leaves a partial final window
    optimizer: str = "sgd"
    scheduler: bool = False
    max_grad_norm: float | None = None
    scaler: bool = False
    uneven: bool = True
    vary_batch_size: bool = False
    normalization: str = "sum"
    drop_last_window: bool = False
    sync: str = "deferred"
    seed: int = 0

    def with_(self, **kw: Any) -> Case:
        return replace(self, **kw)


def make_model(case: Case) -> torch.nn.Module:
    torch.manual_seed(1000 + case.seed)
    return TokenMLP()


def make_data(case: Case, world_size: int) -> list[list[dict[str, torch.Tensor]]]:
    return make_rank_batches(seed=case.seed, world_size=world_size,
                             micro_batches=case.micro_batches, uneven=case.uneven,
                             vary_batch_size=case.vary_batch_size)


def make_optimizer(case: Case, params: Any) -> torch.optim.Optimizer:
    if case.optimizer == "sgd":
        return torch.optim.SGD(params, lr=0.5, momentum=0.9)
    if case.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    raise AssertionError(case.optimizer)


def make_scheduler(case: Case, opt: torch.optim.Optimizer) -> Any:
    if not case.scheduler:
        return None
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def reference_for(case: Case, world_size: int) -> ReferenceRun:
    data = make_data(case, world_size)
    windows = windows_for_reference(data, case.accumulation_steps, case.drop_last_window)
    return reference_run(
        make_model(case), lambda p: make_optimizer(case, p), windows, token_loss,
        make_scheduler=(lambda o: make_scheduler(case, o)) if case.scheduler else None,
        max_grad_norm=case.max_grad_norm)


def update_errors(case: Case, world_size: int,
                  snapshots: list[dict[str, torch.Tensor]]) -> list[float]:
    """Relative update error after every optimizer step (asserts the step count matches)."""
    ref = reference_for(case, world_size)
    assert len(snapshots) == len(ref.params), (
        f"{case}: {len(snapshots)} optimizer steps, reference took {len(ref.params)}")
    return [relative_update_error(ref.initial, s, r) for s, r in zip(snapshots, ref.params,
                                                                    strict=True)]


def train_with_accumulator(case: Case, model: torch.nn.Module, engine: Any,
                           batches: list[Any], optimizer: Any = None,
                           scheduler: Any = None) -> tuple[list[dict], list[int | None], Any]:
    """Run ``case`` through an Accumulator; return per-step snapshots, collectives per step,
    and the Accumulator. ``engine`` is an Engine instance or name."""
    from accumguard import Accumulator
    from accumguard.demo.toy import count_tokens
    from accumguard.verify.reference import flat_params

    opt = optimizer if optimizer is not None else make_optimizer(case, model.parameters())
    sched = scheduler if scheduler is not None else make_scheduler(case, opt)
    scaler = torch.amp.GradScaler("cpu") if case.scaler else None
    acc = Accumulator(
        model, opt, accumulation_steps=case.accumulation_steps, engine=engine,
        scheduler=sched, scaler=scaler, max_grad_norm=case.max_grad_norm,
        normalization=case.normalization,
        count_fn=count_tokens if case.normalization == "sum" else None,
        drop_last_window=case.drop_last_window)

    def loss(batch: Any) -> torch.Tensor:
        s, n = token_loss(model, batch)
        return s if case.normalization == "sum" else s / n

    snaps: list[dict] = []
    colls: list[int | None] = []
    for window in acc.windows(batches):
        before = acc.grad_collectives
        window.run(loss)
        after = acc.grad_collectives
        colls.append(None if after is None or before is None else after - before)
        snaps.append(flat_params(model))
    return snaps, colls, acc


def engine_cases(seed: int) -> list[Case]:
    """The three cases every sharded/ZeRO engine grid runs (seeds ``seed``..``seed + 2``)."""
    return [
        # partial final window (10 = 4 + 4 + 2), uneven batch sizes, scheduler, clipping active
        Case(accumulation_steps=4, micro_batches=10, optimizer="adamw", scheduler=True,
             max_grad_norm=0.2, vary_batch_size=True, seed=seed),
        # K = 1: every micro-step is a boundary
        Case(accumulation_steps=1, micro_batches=3, optimizer="sgd", max_grad_norm=0.2,
             seed=seed + 1),
        # no clipping, partial window (9 = 4 + 4 + 1)
        Case(accumulation_steps=4, micro_batches=9, optimizer="sgd", seed=seed + 2),
    ]


def cpu_mesh() -> Any:
    """A 1-D CPU device mesh over the whole (gloo) world, for ``fully_shard(..., mesh=...)``.

    FSDP2's default mesh is CUDA whenever CUDA is visible, even under gloo: every test
    that shards on CPU ranks passes this mesh so the suite runs unchanged on a GPU host."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a launcher's rendezvous (asked of the OS, then closed:
    a tiny race that the launchers' own retries absorb)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launcher_env() -> dict[str, str]:
    """This process's environment without any surrounding job's rendezvous or accumguard
    settings, one thread per rank and DeepSpeed on the CPU: for real launcher commands."""
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_",
                                "ACCUMGUARD_"))}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    return env


#: What a rank prints when torch/gloo aborts it at process teardown (seen in plain torchrun
#: launches with no accumguard in them: a ``std::thread`` of gloo's destroyed while joinable)
TEARDOWN_ABORT = "terminate called without an active exception"


def run_launch(command: list[str], timeout: float,
               before_retry: Callable[[], None] | None = None) -> Any:
    """Run a launcher command (torchrun, deepspeed) with :func:`launcher_env`; a launch that
    failed only by torch/gloo's teardown abort (:data:`TEARDOWN_ABORT` in its output) is run
    once more on a fresh port, after ``before_retry`` (which clears what the first launch
    recorded), and says so on stderr. Any other failure is the test's to report."""
    import subprocess
    import sys

    proc = subprocess.run(command, env=launcher_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr + proc.stdout:
        print(f"tests.helpers.run_launch: torch/gloo's teardown abort ({TEARDOWN_ABORT!r}) "
              "ended the launch; running it once more", file=sys.stderr)
        if before_retry is not None:
            before_retry()
        command = [str(free_port()) if i and command[i - 1] in (
                       "--master-port", "--master_port", "--main_process_port") else c
                   for i, c in enumerate(command)]
        proc = subprocess.run(command, env=launcher_env(), capture_output=True, text=True,
                              timeout=timeout)
    return proc


def recorded_failures(out_dir: Any) -> list[dict[str, Any]]:
    """The ``internal_error`` records a watched run left in ``out_dir`` (accumguard's own
    failures, each with where it happened and its message)."""
    import json
    return [r for f in Path(out_dir).glob("rank-*.jsonl") for line in f.read_text().splitlines()
            if (r := json.loads(line)).get("kind") == "internal_error"]


#: runs recorded by ``accumguard watch --keep`` (2 real ranks) that rule tests judge in process
RECORDED = Path(__file__).parent / "observe" / "recorded"


def judge_recorded(name: str, k: int | None = None) -> list[Any]:
    """The findings of watch's rules on a recorded run (``tests/observe/recorded/<name>``,
    ``k``: K as the command line would give it): a rule is tested on a real run's windows
    without launching the run again."""
    from accumguard.observe.rules import analyze
    from accumguard.watch._findings import load_recordings

    findings, _, _ = analyze(load_recordings(RECORDED / name), k_flag=k)
    return list(findings)
