"""Run a function on W real ``torch.distributed`` ranks, safely.

This is the one place that spawns processes: the test suite, the audit and the
demo all go through :func:`run_on_ranks`. Its guarantees:

* rendezvous on ``127.0.0.1`` through a TCP store the parent binds to a free
  port (no port race), or through a file;
* every rank gets ``OMP_NUM_THREADS=1`` and a process-group timeout;
* a worker that raises is reported as :class:`RankFailedError` with its rank
  and traceback, and the other ranks are killed instead of waiting forever;
* a hard wall-clock timeout; on expiry every rank's process group is killed
  (:class:`RankTimeoutError`), so no orphan survives the call;
* ``barrier`` + ``destroy_process_group`` in ``finally`` on every rank.

The function must be importable by the child (a module-level function), since
ranks start with the ``spawn`` method, which is also what CUDA requires.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from accumguard.core.errors import ConfigError, RankFailedError, RankTimeoutError

__all__ = ["run_on_ranks", "free_env"]

# Variables a parent torchrun job would leak into our workers.
_LEAKY_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_env() -> dict[str, str]:
    """Environment without torchrun/elastic variables (they would hijack our rendezvous)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _LEAKY_ENV and not k.startswith("TORCHELASTIC_")
    }


def _worker(
    fn: Callable[..., Any],
    args: Sequence[Any],
    rank: int,
    world_size: int,
    backend: str,
    store_addr: tuple[str, int] | None,
    init_file: str | None,
    pg_timeout: float,
    results: Any,
    env: dict[str, str],
) -> None:
    # Own process group, so that the parent can kill this rank and anything it started.
    with contextlib.suppress(OSError):
        os.setpgrp()
    os.environ.update(env)
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
         "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1"}
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=pg_timeout)
    failed: bool | None = None
    try:
        if store_addr is not None:
            os.environ["MASTER_PORT"] = str(store_addr[1])
            store = dist.TCPStore(store_addr[0], store_addr[1], world_size, is_master=False,
                                  timeout=timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timeout)
        else:
            dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                    world_size=world_size, timeout=timeout)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        failed = True
        try:
            value = fn(rank, world_size, *args)
            # Report before the teardown barrier, so a hang is blamed on the rank that hung.
            # Plain pickle: torch's queue pickler would pass tensors as shared-memory handles
            # that die with this process.
            results.put((rank, "ok", pickle.dumps(value)))
            failed = False
        except BaseException:  # noqa: BLE001 - report now, not after a teardown barrier
            results.put((rank, "error", traceback.format_exc()))
            raise
        finally:
            if not failed:  # a failed rank skips the barrier the others may never reach
                with contextlib.suppress(Exception):
                    dist.barrier()
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        if failed is None:  # init failed; fn's own failures were reported above
            results.put((rank, "error", traceback.format_exc()))


def _kill(procs: list[mp.process.BaseProcess]) -> None:
    for p in procs:
        if p.pid is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        p.join(timeout=5)


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    args: Sequence[Any] = (),
    *,
    timeout: float = 300.0,
    backend: str = "gloo",
    rendezvous: str = "tcp",
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes.

    Returns the per-rank return values, ordered by rank (they must be picklable).
    Raises :class:`RankFailedError` for the first rank that raised (others are
    killed), :class:`RankTimeoutError` when ``timeout`` seconds pass first.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size ({world_size!r}) must be a positive int, e.g. 2")
    if rendezvous not in ("tcp", "file"):
        raise ConfigError(f"rendezvous ({rendezvous!r}) must be 'tcp' or 'file'")
    import torch.distributed as dist

    child_env = {**free_env(), "OMP_NUM_THREADS": "1", **(env or {})}
    # A collective waits at most this long, so a stuck rank errors out before the hard kill.
    pg_timeout = max(10.0, timeout * 0.8)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = None
    tmpdir = None
    store_addr: tuple[str, int] | None = None
    init_file: str | None = None
    if rendezvous == "tcp":
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                              timeout=datetime.timedelta(seconds=pg_timeout),
                              wait_for_workers=False)
        store_addr = ("127.0.0.1", store.port)
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="accumguard-rdzv-")
        init_file = os.path.join(tmpdir.name, "rendezvous")
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, tuple(args), r, world_size, backend, store_addr, init_file, pg_timeout,
                  results, child_env),
            name=f"accumguard-rank{r}",
        )
        for r in range(world_size)
    ]
    out: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(out) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RankTimeoutError(sorted(set(range(world_size)) - set(out)), timeout)
            try:
                rank, status, value = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if r not in out and p.exitcode is not None]
                if dead:
                    # Give a late result a moment to arrive through the queue.
                    try:
                        rank, status, value = results.get(timeout=2.0)
                    except queue.Empty:
                        r = dead[0]
                        raise RankFailedError(
                            r, f"process exited with code {procs[r].exitcode} "
                            "without reporting (killed, or crashed in native code)") from None
                else:
                    continue
            if status == "error":
                raise RankFailedError(rank, value)
            out[rank] = pickle.loads(value)
        for p in procs:
            p.join(timeout=10)
        return [out[r] for r in range(world_size)]
    finally:
        _kill([p for p in procs if p.is_alive() or p.exitcode is None])
        results.close()
        if tmpdir is not None:
            tmpdir.cleanup()
        del store
