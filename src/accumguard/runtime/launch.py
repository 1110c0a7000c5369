"""Run a function on W real ``torch.distributed`` ranks, safely.

This is the one place that spawns processes: the test suite, the audit and the
demo all go through :func:`run_on_ranks`. Its guarantees:

* rendezvous on ``127.0.0.1`` through a TCP store the parent binds to a free
  port (no port race), or through a file;
* every rank gets ``OMP_NUM_THREADS=1`` and a process-group timeout;
* a worker that raises is reported as :class:`RankFailedError` with its rank
  and traceback, and the other ranks are killed instead of waiting forever;
* a hard wall-clock timeout; on expiry every rank's process group is killed
  (:class:`RankTimeoutError`, naming the ranks that were still *starting* apart from
  the ones that hung), so no orphan survives the call;
* the rank that died is the one named: a rank that exits (``os._exit``, a signal, a
  native crash) without reporting is blamed, not the peer whose collective then broke;
* SIGTERM, SIGINT or SIGHUP to the parent (a CI cancellation, a job scheduler, a
  closed terminal) terminates every rank's process group (SIGTERM, a short grace,
  then SIGKILL) before the parent dies of the same signal; each rank also asks the
  kernel to kill it if the parent dies without cleaning up (``PR_SET_PDEATHSIG``);
* arguments that cannot work are refused up front: a timeout that is not positive,
  more ranks than this machine can start, more ``nccl`` ranks than visible GPUs;
* each rank's device is decided by one pure function, :func:`rank_device`: ``cuda:rank``
  under ``nccl``, bound with ``set_device`` and ``device_id`` *before*
  ``init_process_group``; the CPU under ``gloo``, where ``set_device`` is never called
  (a host with one GPU visible must still run 2 CPU ranks);
* ``barrier`` + ``destroy_process_group`` in ``finally`` on every rank.

The function must be importable by the child (a module-level function), since
ranks start with the ``spawn`` method, which is also what CUDA requires.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from accumguard.core.errors import ConfigError, RankFailedError, RankTimeoutError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

    import torch

R = TypeVar("R")
#: what a rank sends the parent: (rank, "started" | "ok" | "error", the pickled return
#: value (bytes) or the traceback (str))
_Message = tuple[int, str, Any]

__all__ = ["run_on_ranks", "free_env", "max_ranks", "rank_device", "uses_cuda"]

#: Signals of the parent that end every rank (then the parent, as the signal would have).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Seconds a rank gets to exit after SIGTERM before it is killed.
KILL_GRACE = 1.5
# Rough resident size of one CPU rank with torch imported and a small model (measured
# 300-400 MB here); used to refuse a world size the machine cannot hold.
_RANK_MEMORY = 300 * 2**20

# Variables a parent torchrun job would leak into our workers.
_LEAKY_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_env() -> dict[str, str]:
    """Environment without torchrun/elastic variables (they would hijack our rendezvous)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _LEAKY_ENV and not k.startswith("TORCHELASTIC_")
    }


def max_ranks() -> int:
    """How many ranks this machine can start in reasonable time: 4 per usable CPU core and
    what the available memory holds at ~300 MB a rank (``ACCUMGUARD_MAX_RANKS`` overrides)."""
    override = os.environ.get("ACCUMGUARD_MAX_RANKS")
    if override and override.isdigit() and int(override) > 0:
        return int(override)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    limit = 4 * cpus
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                limit = min(limit, int(line.split()[1]) * 1024 // _RANK_MEMORY)
    return max(2, limit)


def uses_cuda(backend: str) -> bool:
    """Whether ``backend`` reduces on GPUs: ``nccl``, alone or in a mixed backend string
    such as ``"cpu:gloo,cuda:nccl"``. Every other backend (gloo, mpi) runs on the CPU."""
    return "nccl" in backend.lower()


def _visible_gpus() -> int:
    """CUDA devices this process can see (0 without CUDA). Does not initialise CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_device(backend: str, local_rank: int, local_world_size: int,
                device_count: int | None = None) -> torch.device:
    """The ``torch.device`` a rank computes on, or a :class:`ConfigError` when it has none.

    Pure given ``device_count`` (the visible GPUs; read from torch when ``None``), so the
    decision is unit-tested without a GPU. Under ``nccl`` each local rank owns one GPU,
    ``cuda:local_rank``: two ranks on one GPU make NCCL fail with "Duplicate GPU detected",
    so more local ranks than GPUs is refused, never wrapped around. Under any other
    backend the rank computes on the CPU whatever GPUs are visible: ``LOCAL_RANK`` must
    not pick a GPU there (rank 1 on a 1-GPU host would ``set_device(1)`` and crash).
    """
    import torch

    if not uses_cuda(backend):
        return torch.device("cpu")
    seen = _visible_gpus() if device_count is None else device_count
    if local_world_size > seen or not 0 <= local_rank < seen:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise ConfigError(
            f"backend {backend!r} with {local_world_size} rank(s) on this host needs one GPU "
            f"per rank; seen {seen} visible CUDA device(s){where}, expected at least "
            f"{max(local_world_size, local_rank + 1)}. Fix: use at most {seen} rank(s) per "
            "host, make more GPUs visible, or use backend='gloo' for CPU ranks"
            if seen else
            f"backend {backend!r} needs CUDA GPUs; seen none visible{where} (torch "
            f"{torch.__version__}, cuda available: {torch.cuda.is_available()}), expected "
            f"{max(local_world_size, local_rank + 1)}. Fix: run on a CUDA host with a CUDA "
            "build of torch, or use backend='gloo' for CPU ranks")
    return torch.device("cuda", local_rank)


def _bind_device(backend: str, rank: int, world_size: int) -> torch.device | None:
    """Bind this rank to its device *before* ``init_process_group`` and return the
    ``device_id`` to give it: the GPU under nccl (the group is then bound to that GPU and
    initialised eagerly, and NCCL never guesses the device from ``current_device()``); None
    (torch's default) under gloo, where ``set_device`` is never called."""
    import torch

    device = rank_device(backend, rank, world_size)
    if device.type != "cuda":
        return None
    torch.cuda.set_device(device)
    return device


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this rank when the parent dies, even by SIGKILL (which no
    handler sees). Elsewhere a no-op; the parent's signal handlers still clean up."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _worker(
    fn: Callable[..., object],
    args: Sequence[object],
    rank: int,
    world_size: int,
    backend: str,
    store_addr: tuple[str, int] | None,
    init_file: str | None,
    pg_timeout: float,
    results: Queue[_Message],
    env: dict[str, str],
) -> None:
    # Own process group, so that the parent can kill this rank and anything it started.
    parent = os.getppid()
    with contextlib.suppress(OSError):
        os.setpgrp()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
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
        device_id = _bind_device(backend, rank, world_size)
        if store_addr is not None:
            os.environ["MASTER_PORT"] = str(store_addr[1])
            # torch.distributed imports TCPStore from torch._C without re-exporting it (stub gap)
            store = dist.TCPStore(store_addr[0], store_addr[1], world_size, is_master=False,  # type: ignore[attr-defined]
                                  timeout=timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timeout, device_id=device_id)
        else:
            dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                    world_size=world_size, timeout=timeout,
                                    device_id=device_id)
        results.put((rank, "started", b""))
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


def _kill(procs: list[mp.process.BaseProcess], grace: float = 0.0) -> None:
    """End every rank and everything it started (its own process group): SIGTERM, up to
    ``grace`` seconds to exit, then SIGKILL."""
    live = [p for p in procs if p.pid is not None]
    if grace > 0:
        for p in live:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.killpg(p.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.is_alive() for p in live):
            time.sleep(0.05)
    for p in live:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
        with contextlib.suppress(Exception):
            p.kill()
    for p in live:
        p.join(timeout=5)


class _ParentSignal(BaseException):
    """Raised in the parent by a forwarded signal, so ``finally`` blocks clean up first."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")


@contextlib.contextmanager
def _forward_signals() -> Iterator[None]:
    """While ranks run: SIGTERM/SIGINT/SIGHUP become an exception in the parent (so the
    spawner's ``finally`` terminates the ranks), and once they are gone the parent dies
    of the same signal with its previous handler (exit status 128 + signal, as expected
    by shells and schedulers; SIGINT stays a KeyboardInterrupt). Only the main thread
    can install handlers; elsewhere the parent-death signal of each rank still applies."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    fired: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if fired:  # a second signal must not interrupt the cleanup the first one started
            return
        fired.append(signum)
        raise _ParentSignal(signum)

    for sig in FORWARDED_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    except _ParentSignal as got:
        _restore(previous)
        previous = {}
        if got.signum == signal.SIGINT:
            raise KeyboardInterrupt from None
        os.kill(os.getpid(), got.signum)  # the previous handler (default: die) takes it
        time.sleep(1.0)  # pragma: no cover - a handler that returns: carry on as interrupted
        raise
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    for sig, old in previous.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(sig, old)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_on_ranks(
    fn: Callable[..., R],
    world_size: int = 2,
    args: Sequence[object] = (),
    *,
    timeout: float = 300.0,
    backend: str = "gloo",
    rendezvous: str = "tcp",
    env: dict[str, str] | None = None,
) -> list[R]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes.

    Returns the per-rank return values, ordered by rank (they must be picklable).
    Raises :class:`RankFailedError` for the first rank that raised (others are
    killed), :class:`RankTimeoutError` when ``timeout`` seconds pass first.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size ({world_size!r}) must be a positive int, e.g. 2")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError(
            f"timeout ({timeout!r}) must be a positive number of seconds; expected the time "
            "the whole run may take, e.g. 300 (0 would kill the ranks before they start)")
    limit = max_ranks()
    if world_size > limit:
        raise ConfigError(
            f"world_size {world_size} is more ranks than this machine can start in time "
            f"(limit {limit}: 4 per usable CPU core and ~300 MB of available memory per "
            "rank); expected at most that. Use fewer ranks (the accumulation is checked the "
            "same with 2), or set ACCUMGUARD_MAX_RANKS to override")
    if rendezvous not in ("tcp", "file"):
        raise ConfigError(f"rendezvous ({rendezvous!r}) must be 'tcp' or 'file'")
    # Every rank runs on this host: under nccl it needs its own GPU. Refused here, in the
    # parent, before any process starts (device_count() does not initialise CUDA).
    rank_device(backend, world_size - 1, world_size)
    import torch.distributed as dist

    child_env = {**free_env(), "OMP_NUM_THREADS": "1", **(env or {})}
    # A collective waits at most this long, so a stuck rank errors out before the hard kill.
    pg_timeout = max(10.0, timeout * 0.8)
    ctx = mp.get_context("spawn")
    results: Queue[_Message] = ctx.Queue()
    store = None
    tmpdir = None
    store_addr: tuple[str, int] | None = None
    init_file: str | None = None
    if rendezvous == "tcp":
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,  # type: ignore[attr-defined]  # torch stub gap, see _worker
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
    out: dict[int, R] = {}
    started: set[int] = set()
    grace = 0.0
    # The ranks are ended inside the signal context: the parent dies of a forwarded signal
    # only after this `finally` has run.
    with _forward_signals():
        try:
            for p in procs:
                p.start()
            _collect(procs, results, out, started, timeout)
            for p in procs:
                p.join(timeout=10)
            return [out[r] for r in range(world_size)]
        except _ParentSignal:
            grace = KILL_GRACE  # let ranks run their own cleanup first
            raise
        finally:
            _kill([p for p in procs if p.is_alive() or p.exitcode is None], grace=grace)
            results.close()
            if tmpdir is not None:
                tmpdir.cleanup()
            del store


def _collect(procs: Sequence[BaseProcess], results: Queue[_Message], out: dict[int, R],
             started: set[int], timeout: float) -> None:
    """Read results until every rank reported; raise for the rank that really failed."""
    world_size = len(procs)
    deadline = time.monotonic() + timeout
    while len(out) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(set(range(world_size)) - set(out))
            raise RankTimeoutError(missing, timeout,
                                   starting=[r for r in missing if r not in started])
        try:
            rank, status, value = results.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            dead = _silent_deaths(procs, out, set())
            if dead:
                # Give a late result a moment to arrive through the queue.
                try:
                    rank, status, value = results.get(timeout=2.0)
                except queue.Empty:
                    r = dead[0]
                    raise RankFailedError(
                        r, f"process {_exit_text(procs[r].exitcode)} without reporting "
                        "(os._exit, a signal, or a crash in native code)") from None
            else:
                continue
        if status == "started":
            started.add(rank)
            continue
        if status == "error":
            _raise_root_cause(procs, results, out, rank, value)
        out[rank] = pickle.loads(value)


def _silent_deaths(procs: Sequence[BaseProcess], out: dict[int, R], errored: set[int]) -> list[int]:
    return [r for r, p in enumerate(procs)
            if r not in out and r not in errored and p.exitcode is not None]


# Phrases of the error a rank gets when a *peer* went away mid-collective: a consequence,
# not a cause (gloo, NCCL and torch.distributed's own wording).
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "DistBackendError", "remote process exited", "communicator was aborted",
              "Socket Timeout", "Connection refused")


def _is_peer_lost(remote: str) -> bool:
    return any(s in remote for s in _PEER_LOST)


def _raise_root_cause(procs: Sequence[BaseProcess], results: Queue[_Message], out: dict[int, R],
                      rank: int,
                      remote: str) -> None:
    """A rank raised. Find the rank that *caused* it before blaming this one: another rank
    that died without reporting (os._exit, a signal), or, when this error only says that a
    peer went away mid-collective, another rank's own error arriving a moment later. Wait up
    to 2 s for either; otherwise this rank is the cause."""
    errored = {rank}
    secondary = _is_peer_lost(remote)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        dead = _silent_deaths(procs, out, errored)
        if dead:
            r = dead[0]
            # A report from the dead rank may still be in the pipe: then it did not die
            # silently. Its error is the cause only if ours merely says a peer went away.
            with contextlib.suppress(queue.Empty):
                while True:
                    late_rank, status, value = results.get(timeout=0.3)
                    if late_rank == r and status == "error":
                        if secondary and not _is_peer_lost(value):
                            raise RankFailedError(r, value)
                        raise RankFailedError(rank, remote)
            last = remote.strip().splitlines()[-1] if remote.strip() else "an error"
            raise RankFailedError(
                r, f"process {_exit_text(procs[r].exitcode)} without reporting (os._exit, a "
                f"signal, or a crash in native code); rank {rank} then failed with: {last}")
        if not secondary:
            # A genuine error of this rank: only a silent death elsewhere can outrank it.
            if all(p.exitcode is None for i, p in enumerate(procs) if i not in out and i != rank):
                time.sleep(0.1)
            else:
                time.sleep(0.05)
            continue
        with contextlib.suppress(queue.Empty):
            other, status, value = results.get(timeout=0.1)
            if status == "error" and other not in errored:
                errored.add(other)
                if not _is_peer_lost(value):
                    raise RankFailedError(other, value)
            elif status == "ok":
                out[other] = pickle.loads(value)
    raise RankFailedError(rank, remote)
