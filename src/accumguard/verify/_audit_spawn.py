"""Where the audited loops run: W spawned ranks (or the live process group), each loop on a
fresh model under the observer, TF32 off; with progress reported to the parent process.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable
from typing import Any

import torch

from accumguard.verify._observer import Observer
from accumguard.verify.contract import AuditSetup, Loop, LoopContext
from accumguard.verify.reference import move_to
from accumguard.verify.report import LoopObservation

ProgressFn = Callable[[str, int, int], None]


def _loop_name(loop: Any) -> str:
    inner = getattr(loop, "func", loop)
    return getattr(inner, "__name__", type(inner).__name__)


def _spawn(setup: AuditSetup, names: list[str], fns: list[Loop], world_size: int, backend: str,
           timeout: float, steps: int | None, progress: ProgressFn | None) -> list[Any]:
    from accumguard.runtime.launch import run_on_ranks

    if progress is None:
        return run_on_ranks(_rank_main, world_size, (setup, names, fns, steps, None),
                            timeout=timeout, backend=backend)
    import multiprocessing as mp
    import queue
    import threading

    q = mp.get_context("spawn").Queue()
    stop = threading.Event()
    total = _expected_steps(setup, world_size, steps)

    def pump() -> None:
        while not stop.is_set():
            try:
                loop_name, done = q.get(timeout=0.2)
            except (queue.Empty, OSError, EOFError, ValueError):
                continue
            with contextlib.suppress(Exception):
                progress(loop_name, done, total)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        return run_on_ranks(_rank_main, world_size, (setup, names, fns, steps, q),
                            timeout=timeout, backend=backend)
    finally:
        stop.set()
        th.join(timeout=2)
        q.close()


def _expected_steps(setup: AuditSetup, world_size: int, steps: int | None) -> int:
    n = len(setup.rank_batches(0, world_size))
    k = setup.accumulation_steps
    total = -(-n // k)
    return (total if steps is None else min(total, steps)) * setup.epochs


def _rank_batches(setup: AuditSetup, rank: int, world: int, steps: int | None) -> list[Any]:
    batches = list(setup.rank_batches(rank, world))
    if steps is not None:
        batches = batches[: steps * setup.accumulation_steps]
    return batches


def _all_rank_batches(setup: AuditSetup, world: int, steps: int | None) -> list[list[Any]]:
    return [_rank_batches(setup, r, world, steps) for r in range(world)]


def _rank_main(rank: int, world: int, setup: AuditSetup, names: list[str], fns: list[Loop],
               steps: int | None, q: Any) -> list[LoopObservation]:
    return _observe_loops(rank, world, setup, names, fns, steps, q)


def audit_device() -> torch.device:
    """This rank's compute device under the live process group: ``cuda:LOCAL_RANK`` under
    nccl, the CPU under gloo or without a group (the one decision,
    :func:`accumguard.runtime.launch.rank_device`). ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``
    come from torchrun or from the audit's own spawner; without them, the global ones."""
    import torch.distributed as dist

    from accumguard.runtime.launch import rank_device

    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return rank_device(str(dist.get_backend()), local, local_world)


@contextlib.contextmanager
def _fp32_matmuls() -> Any:
    """TF32 off while loops are audited, then the previous settings back. With TF32 an
    "fp32" CUDA matmul or convolution rounds its inputs to a 10-bit mantissa (about 1e-3
    relative), far above the fp32 tolerance the report would state. Only CUDA reads
    these flags; on the CPU this changes nothing. A loop that switches TF32 back on is
    seen by the observer and judged at that precision (see ``Observer._note_precision``)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = False
    cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def _observe_loops(rank: int, world: int, setup: AuditSetup, names: list[str],
                   fns: list[Loop], steps: int | None, q: Any,
                   device: torch.device | None = None) -> list[LoopObservation]:
    device = audit_device() if device is None else torch.device(device)
    out = []
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with _fp32_matmuls(), on_device:
        for key, fn in zip(names, fns, strict=True):
            # Built where the reference is built (the CPU, deterministic), then moved: the
            # loop starts from bit-identical weights on any device.
            model = setup.build_model().to(device)
            batches = _rank_batches(setup, rank, world, steps)
            if device.type != "cpu":
                batches = move_to(batches, device)
            ctx = LoopContext(rank=rank, world_size=world, setup=setup, model=model,
                              batches=batches, device=device)
            obs = Observer(ctx, key, q if rank == 0 else None)
            try:
                with obs.installed():
                    fn(ctx)
                    obs.finish()
            except BaseException as exc:  # noqa: BLE001 - re-raised with the loop's name
                raise RuntimeError(f"loop {key!r} raised on rank {rank}:\n"
                                   f"{traceback.format_exc()}") from exc
            out.append(obs.result())
    return out
