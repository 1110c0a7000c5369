"""Injecting the observation layer into an unmodified command, and the per-rank recording.

A child command started with :func:`observed_env` (``accumguard watch``, ``accumguard
invariance``) runs with the directory :data:`BOOTSTRAP_DIR` first on ``PYTHONPATH``.
Its ``sitecustomize`` (which then runs any pre-existing ``sitecustomize``) calls
:func:`start_agent` in every Python process of the command: the launcher (``torchrun``,
``deepspeed``, ``accelerate launch``) and each rank. Nothing happens until torch is
imported; then an :class:`~accumguard.observe.Observer` is installed and a recorder
writes, per rank, ``<dir>/rank-<R>.jsonl`` (R = ``RANK`` or the torch.distributed rank,
0 for a single process). A process that never runs a backward or an optimizer step
(the launcher) writes nothing. The same bootstrap then applies ``accumguard
invariance``'s seed/dropout hooks (:func:`accumguard.observe.invariance_hooks.install_from_env`,
a no-op unless its variables are set): one bootstrap for both commands.

The recording, one JSON object per line (flushed at every optimizer step, at exit, in
``dist.destroy_process_group`` and on SIGTERM):

* ``{"kind": "start", "rank", "world", "pid", "ppid", "argv"}`` first (``ppid``: a recording
  whose parent process also recorded is a subprocess of the script, not a rank);
* ``{"kind": "engine", ...}``: the configuration the engine really runs with;
* ``{"kind": "step", "rank", "step", "backwards", "window_loss", "applied", ...}`` per
  optimizer step: ``step`` counts optimizer steps from 0; ``backwards`` the backward
  passes since the previous step; ``window_loss`` the sum of ``float(loss)`` over them
  (the tensor ``backward`` was called on, or the loss given to ``engine.backward`` /
  ``accelerator.backward``; null if one was not a scalar); ``applied`` False when every
  gradient was None or the engine skipped the update. Further keys: ``engine``,
  ``zero_grads_between``, ``scheduler_steps``, ``clip_micros``, ``reductions``,
  ``reduction_rounds``, ``sync_micros``, ``sync_mismatch``, ``ds_boundaries``,
  ``ds_coalescing``, ``engine_step_calls``, ``max_backwards_per_engine_step``,
  ``grad_norm``, ``conservation`` ({params, wiped, stale, received, ok, reason} or
  null), ``checksum`` (what the optimizer received, for cross-rank agreement), ``wall``,
  ``sync_backward`` (the DDP/FSDP2 sync flag at each backward), ``param_dtype`` (of the
  parameters the optimizer stepped: ``accumguard invariance``'s tolerance reads it),
  ``comm`` (the window's collectives: :meth:`~accumguard.observe._comm_ledger.CommLedger.take`),
  ``losses`` (the loss record, :mod:`accumguard.observe._losses`) and ``rank_factor``
  (what the engine multiplies the sum over ranks of the gradients by; the loss-weight
  ledger reads both). The raw ``step`` counts from 0; every report shows it 1-based;
* ``{"kind": "scheduler", "step", "micro", "count", "optimizer_steps", "in_step", "sid",
  "pos", "horizon", "horizon_what"}`` and ``"fresh": true`` while its optimizer has not
  stepped (``pos``: the scheduler's ``last_epoch``; ``horizon``:
  where its schedule ends, when the object states it: :mod:`accumguard.observe._schedules`);
* ``{"kind": "tail", "reason", "steps", "backwards", "pending_backwards", "passes",
  "schedulers"}`` after an end record with reason ``observed``: what the run did after
  observation ended, counted (:mod:`accumguard.observe._tail`), at its real end;
* ``{"kind": "end", "reason", "pending_backwards", "declared_k", "collective"}`` last
  (and ``k_changes``, ``[[backwards so far, K], ...]``, when a framework set K per epoch:
  Lightning's ``GradientAccumulationScheduler``; ``tracked``, the checksummed parameters'
  names in the conservation rows' order, when there are at most ``_MAX_NAMED``)
  (``reason``: ``exit``, ``max_steps``, ``destroy_process_group``, ``signal``, ``observed``
  (observation ended after ``ACCUMGUARD_OBSERVE_STEPS``, the run went on);
  ``collective``: ``{open, last_done, failed, calls}`` from
  :meth:`~accumguard.observe._collectives.CollectiveCounter.state`: the collective the
  rank was inside when it ended, the last it left, the last that raised).

Options (environment, set by :func:`observed_env`): ``ACCUMGUARD_RECORD_UPDATES=1``
keeps each applied step's update (param after - before, float64 CPU, this rank's
shard/partition) and saves ``<dir>/updates-rank-<R>.pt`` (``torch.save`` of a list, one
``{param_name: tensor}`` per step) at exit; ``ACCUMGUARD_MAX_STEPS=N`` flushes
everything after N optimizer steps and ends the process with exit code 0 (after a
barrier when torch.distributed is initialised: all ranks reach step N together);
``ACCUMGUARD_OBSERVE_EVERY=N`` checks conservation on every N-th window only.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # (imported lazily at run time: the bootstrap stays light until torch is)
    import torch

    from accumguard.observe._comm_ledger import CommLedger
    from accumguard.observe._events import EngineInfo, SchedulerEvent, StepEvent
    from accumguard.observe._failsafe import Failure, Original
    from accumguard.observe._observer import Observer
    from accumguard.runtime._advise_modes import _Applier as Applier

__all__ = ["BOOTSTRAP_DIR", "ENV_DIR", "ENV_EVERY", "ENV_MAX_STEPS", "ENV_OBSERVE_STEPS",
           "ENV_RECORD_UPDATES", "OBSERVE_STEPS", "observed_env", "recording", "start_agent"]

ENV_DIR = "ACCUMGUARD_OBSERVE_DIR"
ENV_RECORD_UPDATES = "ACCUMGUARD_RECORD_UPDATES"
ENV_MAX_STEPS = "ACCUMGUARD_MAX_STEPS"
ENV_EVERY = "ACCUMGUARD_OBSERVE_EVERY"
ENV_OBSERVE_STEPS = "ACCUMGUARD_OBSERVE_STEPS"
#: ``accumguard watch``'s default ``--observe-steps``: a long run is observed for its first
#: 64 optimizer steps (and through its first epoch's end when that is in reach), then runs
#: on with nothing of accumguard in it
OBSERVE_STEPS = 64
ENV_DECLARED_K = "ACCUMGUARD_DECLARED_K"
#: names the ``watch`` that started the command, so a directory shared by the watches of
#: several nodes tells each watch which rank files are its own
ENV_WATCH_ID = "ACCUMGUARD_WATCH_ID"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"

_agent: _Agent | None = None


#: the most checksummed parameters whose names the end line lists
_MAX_NAMED = 4096


def observed_env(base_env: Mapping[str, str] | None, out_dir: str | os.PathLike[str], *,
                 record_updates: bool = False, max_steps: int | None = None,
                 every: int = 1, watch_id: str | None = None,
                 observe_steps: int | None = None) -> dict[str, str]:
    """The environment for a child command whose every Python process is observed.

    ``base_env`` (``os.environ`` when None) is copied; the bootstrap directory is put
    first on ``PYTHONPATH`` (keeping the rest, so an existing ``sitecustomize`` still
    runs: ours chains to it); ``out_dir`` receives ``rank-<R>.jsonl`` (and
    ``updates-rank-<R>.pt`` with ``record_updates``). ``max_steps`` ends each rank
    cleanly (exit 0) after that many optimizer steps. ``every`` checks gradient
    conservation on every N-th optimizer step only. ``watch_id`` is written into each
    rank's start record (see :data:`ENV_WATCH_ID`). ``observe_steps`` ends observation
    after that many optimizer steps (:class:`~accumguard.observe.Observer`'s
    ``observe_steps``; ignored with ``record_updates`` or ``max_steps``); None: every step.
    """
    env = dict(os.environ if base_env is None else base_env)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    parts = [str(BOOTSTRAP_DIR)]
    # the package itself must stay importable for the bootstrap (editable or installed)
    pkg_root = str(Path(__file__).resolve().parents[2])
    parts.append(pkg_root)
    old = env.get("PYTHONPATH", "")
    parts += [p for p in old.split(os.pathsep) if p and p not in parts]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env[ENV_DIR] = str(out)
    env.pop(ENV_RECORD_UPDATES, None)
    env.pop(ENV_MAX_STEPS, None)
    if record_updates:
        env[ENV_RECORD_UPDATES] = "1"
    if max_steps is not None:
        if max_steps < 1:
            raise ValueError(f"max_steps ({max_steps}) must be >= 1")
        env[ENV_MAX_STEPS] = str(int(max_steps))
    env[ENV_EVERY] = str(max(1, int(every)))
    env.pop(ENV_OBSERVE_STEPS, None)
    if observe_steps is not None:
        if observe_steps < 1:
            raise ValueError(f"observe_steps ({observe_steps}) must be >= 1 (None: every step)")
        env[ENV_OBSERVE_STEPS] = str(int(observe_steps))
    env.pop(ENV_WATCH_ID, None)
    if watch_id is not None:
        env[ENV_WATCH_ID] = watch_id
    return env


def start_agent() -> None:
    """Called by the bootstrap ``sitecustomize`` in every process of the command: observe
    this process once torch is imported (never importing torch itself)."""
    global _agent
    out_dir = os.environ.get(ENV_DIR)
    if not out_dir or _agent is not None:
        return
    from accumguard.observe._imports import when_imported

    _agent = _Agent(Path(out_dir))
    when_imported("torch", _install_all)


def _install_all(_torch: object = None) -> None:
    """Once torch is imported: the observer, then ``accumguard invariance``'s seed/dropout
    hooks (a no-op unless ``ACCUMGUARD_SEED``/``ACCUMGUARD_NO_DROPOUT`` are set): one
    bootstrap for both commands."""
    assert _agent is not None
    _agent.install()
    from accumguard.observe.invariance_hooks import install_from_env
    from accumguard.runtime._advise_modes import install_from_env as advise_mode

    install_from_env()
    _agent.advise = advise_mode(_agent.observer)  # `accumguard advise`'s mode (if it set one)


@contextlib.contextmanager
def recording(out_dir: str | os.PathLike[str], *, record_updates: bool = False,
              every: int = 1, observe_steps: int | None = None) -> Iterator[Observer]:
    """Observe a block of this process and write its recording to ``out_dir`` (the same
    ``rank-<R>.jsonl`` as under ``accumguard watch``), then remove every patch.

    Runs several scenarios in one process (one directory each) where starting a command
    per scenario would cost a Python and torch start-up each time; the recording is
    analysed with :func:`accumguard.watch._findings.load_recordings`. Yields the
    :class:`~accumguard.observe.Observer`. ``observe_steps``: as :func:`observed_env`'s
    (``accumguard watch`` uses :data:`OBSERVE_STEPS`); None: every step.
    """
    agent = _Agent(Path(out_dir), record_updates=record_updates, every=every,
                   observe_steps=observe_steps)
    agent.install(handlers=False)
    assert agent.observer is not None  # (install made it)
    try:
        yield agent.observer
    finally:
        agent.close("exit")


class _Agent:
    """Owns the observer of this process and writes its recording."""

    def __init__(self, out_dir: Path, *, record_updates: bool | None = None,
                 every: int | None = None, observe_steps: int | None = None) -> None:
        self.out_dir = out_dir
        self.record_updates = (os.environ.get(ENV_RECORD_UPDATES, "") not in ("", "0")
                               if record_updates is None else record_updates)
        max_steps = os.environ.get(ENV_MAX_STEPS, "")
        self.max_steps = (int(max_steps) if max_steps.strip().isdigit() and every is None
                          else None)
        env_every = os.environ.get(ENV_EVERY, "1")
        self.every = every if every is not None else (
            int(env_every) if env_every.strip().isdigit() else 1)
        env_observe = os.environ.get(ENV_OBSERVE_STEPS, "") if every is None else ""
        self.observe_steps = observe_steps if every is not None else (
            int(env_observe) if env_observe.strip().isdigit() and int(env_observe) > 0
            else None)
        if self.record_updates or self.max_steps is not None:
            self.observe_steps = None  # invariance/advise compare every step they asked for
        self.observer: Observer | None = None
        self.ledger: CommLedger | None = None
        self.advise: Applier | None = None  # accumguard advise's mode (runtime._advise_modes)
        self.fh: TextIO | None = None
        self.rank: int | None = None
        self.buffer: list[dict[str, Any]] = []  # JSON records (step_record's own fields)
        self.updates: list[dict[str, torch.Tensor]] = []
        self.closed = False
        self.retired = False  # observation ended at observe_steps (on_retire)
        self._seen = False
        self._bw_base = 0  # the observer's backward count when activity was last reset
        self.pid = os.getpid()

    @property
    def seen_activity(self) -> bool:
        """This process trained (a backward or a step), or accumguard failed in it, since
        the install (or the fork): only then is a recording file opened. A backward is read
        from the observer's own count rather than told by a listener at every backward."""
        if self._seen:
            return True
        obs = self.observer
        return obs is not None and obs.backward_total > self._bw_base

    @seen_activity.setter
    def seen_activity(self, value: bool) -> None:
        self._seen = value
        if not value:
            obs = self.observer
            self._bw_base = obs.backward_total if obs is not None else 0

    # -- installation -------------------------------------------------------------------
    def install(self, _torch: object = None, *, handlers: bool = True) -> None:
        from accumguard.observe import _profiles as profiles
        from accumguard.observe._comm_ledger import CommLedger
        from accumguard.observe._observer import Observer

        # every=1 (default): conservation checked on as many windows as ~1 % of the run's
        # time allows (always the first two); every=N: exactly every N-th window.
        self.observer = obs = Observer.from_profile(
            profiles.watch(self.every, self.record_updates, self.observe_steps))
        self.ledger = CommLedger(obs)  # the step record's "comm" (collectives)
        self.ledger.attach()
        obs.add_listener(self.ledger)
        obs.add_listener(self)
        obs.install()
        self._wrap_destroy()
        if not handlers:  # in-process recording(): the caller closes it
            return
        atexit.register(self.close, "exit")
        self._install_sigterm()
        # after accumguard's own failure nothing of it stays in the way of the script's
        # signals (its wrappers of signal.signal/getsignal are undone with the rest)
        obs.failsafe.on_teardown(self._restore_sigterm)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _install_sigterm(self) -> None:
        """Flush the recording on SIGTERM, invisibly: the handler is installed only over the
        default action, and ``signal.getsignal``/``signal.signal`` report the default action
        in its place. A script's own handler that chains to the previous one (Lightning,
        submitit) then sees what it sees without accumguard (SIG_DFL: nothing to call) and
        replaces ours; a script without one dies of SIGTERM as before, records flushed."""
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
                return
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if signal.getsignal(signal.SIGTERM) != self._on_sigterm:
            return
        ours = self._on_sigterm
        assert self.observer is not None  # (installed first)
        patches = self.observer.patches

        def hide(handler: object) -> object:
            return signal.SIG_DFL if handler == ours else handler

        def make_signal(orig: Original) -> Original:
            def signal_(signalnum: object, handler: object) -> object:
                return hide(orig(signalnum, handler))

            return signal_

        def make_getsignal(orig: Original) -> Original:
            def getsignal(signalnum: object) -> object:
                return hide(orig(signalnum))

            return getsignal

        patches.wrap(signal, "signal", make_signal)
        patches.wrap(signal, "getsignal", make_getsignal)

    def _restore_sigterm(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _forked(self) -> None:
        """A child forked by the script (DataLoader workers, multiprocessing): the parent's
        open file and buffered records are not its own. It records afresh if it trains."""
        self.pid = os.getpid()
        self.fh = None
        self.buffer = []
        self.updates = []
        self.rank = None
        self.seen_activity = False

    def _wrap_destroy(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        agent = self
        assert self.observer is not None  # (installed first)
        patches = self.observer.patches

        def make(orig: Original) -> Original:
            def destroy_process_group(*args: object, **kwargs: object) -> object:
                agent.flush("destroy_process_group")
                return orig(*args, **kwargs)

            return destroy_process_group

        patches.wrap(dist, "destroy_process_group", make)
        dc = sys.modules.get("torch.distributed.distributed_c10d")
        if dc is not None:
            patches.wrap(dc, "destroy_process_group", make)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() == self.pid:
            self.close("signal")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    # -- listener -------------------------------------------------------------------------
    def on_internal_error(self, failure: Failure) -> None:
        """accumguard failed on this rank: say so in the recording at once (the report
        puts it first; steps after it were not observed)."""
        self.seen_activity = True
        self._write({"kind": "internal_error", "rank": self._rank(), **failure.as_dict()})
        self.flush("internal_error")

    def on_retire(self, steps: int) -> None:
        """Observation ends here on purpose (``observe_steps``; the observer removes its
        patches at the next patched call): the end record now, the run's totals after it
        (the ``tail`` record) when the process ends."""
        obs = self.observer
        if obs is not None:
            self._write_end(obs, "observed", False)
        self.flush("observed")
        self.retired = True

    def on_engine(self, info: EngineInfo) -> None:
        from dataclasses import asdict

        self._write({"kind": "engine", **asdict(info)})

    def on_scheduler_step(self, ev: SchedulerEvent) -> None:
        from accumguard.observe._schedules import schedule_state

        self._write({"kind": "scheduler", "step": ev.step, "micro": ev.micro, "count": ev.count,
                     "optimizer_steps": ev.optimizer_steps, "in_step": ev.in_step,
                     **({"fresh": True} if ev.fresh else {}), **schedule_state(ev.owner)})

    def on_step(self, ev: StepEvent) -> None:
        from accumguard.observe.rules import step_record

        self.seen_activity = True
        rec = step_record(ev, self._rank())
        if self.ledger is not None:
            rec["comm"] = self.ledger.take()
        self._write(rec)
        if self.record_updates and ev.updates is not None:
            self.updates.append(ev.updates)
        self._flush_file()
        if self.max_steps is not None and ev.step + 1 >= self.max_steps:
            self._stop_at_max_steps()

    # -- output -----------------------------------------------------------------------------
    def _rank(self) -> int:
        if self.rank is not None:
            return self.rank
        rank = os.environ.get("RANK")
        if rank is not None and rank.strip().isdigit():
            return int(rank)
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        return 0

    def _world(self) -> int:
        world = os.environ.get("WORLD_SIZE")
        if world is not None and world.strip().isdigit():
            return int(world)
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return int(dist.get_world_size())
        return 1

    def _write(self, rec: dict[str, Any]) -> None:
        self.buffer.append(rec)

    def _open(self) -> None:
        if self.fh is not None:
            return
        self.rank = self._rank()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank-{self.rank}.jsonl"
        try:
            self.fh = open(path, "x", encoding="utf-8")  # noqa: SIM115 - kept open, closed at exit
        except FileExistsError:
            self.fh = open(self.out_dir / f"rank-{self.rank}.pid-{os.getpid()}.jsonl", "w",  # noqa: SIM115
                           encoding="utf-8")
        start = {"kind": "start", "rank": self.rank, "world": self._world(), "pid": os.getpid(),
                 "ppid": os.getppid(), "argv": list(sys.argv), "time": time.time(),
                 "watch_id": os.environ.get(ENV_WATCH_ID),
                 "run_id": os.environ.get("TORCHELASTIC_RUN_ID"), "host": socket.gethostname()}
        self.fh.write(json.dumps(start) + "\n")

    def _flush_file(self) -> None:
        if not self.buffer:
            return
        if self.fh is None:
            if not self.seen_activity:
                return
            self._open()
        fh = self.fh
        assert fh is not None  # (_open set it, or raised)
        for rec in self.buffer:
            fh.write(json.dumps(rec, default=_jsonable) + "\n")
        self.buffer.clear()
        fh.flush()

    def flush(self, reason: str = "") -> None:
        with contextlib.suppress(Exception):
            self._flush_file()

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        obs = self.observer
        # a rank stuck in (or failed in) a collective before its first step is still named
        stuck = obs is not None and (obs.counter.open is not None
                                     or obs.counter.failed is not None)
        if self.retired:
            if obs is not None:
                with contextlib.suppress(Exception):  # at exit: never raises
                    self._write(obs.tail_record(reason))
        elif obs is not None and (self.seen_activity or self.fh is not None or stuck):
            self._write_end(obs, reason, stuck)
        with contextlib.suppress(Exception):
            self._flush_file()
        if self.record_updates and self.updates:
            with contextlib.suppress(Exception):
                import torch

                torch.save(self.updates, self.out_dir / f"updates-rank-{self._rank()}.pt")
        if self.fh is not None:
            with contextlib.suppress(Exception):
                self.fh.close()
        if obs is not None:
            with contextlib.suppress(Exception):  # at exit: never an error of the script's
                obs.uninstall()

    def _write_end(self, obs: Observer, reason: str, stuck: bool) -> None:
        with contextlib.suppress(Exception):  # runs at exit and on SIGTERM: never raises
            pending = len(obs._w.backwards)
            self.seen_activity = self.seen_activity or pending > 0 or stuck
            self._write({"kind": "end", "reason": reason, "pending_backwards": pending,
                         "steps": obs.step, "backwards_total": obs.backward_total,
                         **_engine_pending(obs),
                         "declared_k": dict(obs.declared_k), "engine": obs.engine,
                         **({"k_changes": [list(c) for c in obs.k_changes],
                             "k_changes_by": obs.k_changes_by} if obs.k_changes else {}),
                         **({"state_loads": list(obs.state_loads)} if obs.state_loads else {}),
                         "frameworks": list(obs.frameworks),
                         **({"accelerate_unprepared": True}
                            if obs.accelerate_loader[1] and not obs.accelerate_loader[0]
                            else {}),
                         "collective": obs.counter.state(), **_peak_memory(),
                         **_tracked_names(obs),
                         **({"advise_applied": list(self.advise.applied)}
                            if self.advise is not None else {})})

    def _stop_at_max_steps(self) -> None:
        self.close("max_steps")
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)


def _tracked_names(obs: Observer) -> dict[str, list[str | None]]:
    """The names of the checksummed parameters, in the conservation rows' order (None for a
    row whose parameter was dropped): a finding about some rows names them. Empty when
    nothing was tracked or the list is long (a finding then gives positions)."""
    with contextlib.suppress(Exception):
        tracked = obs._tracked
        if 0 < len(tracked) <= _MAX_NAMED:
            return {"tracked": [obs._tracked_names.get(id(p)) for p in tracked]}
    return {}


def _peak_memory() -> dict[str, int]:
    """This process's peak memory for ``accumguard advise``: ``peak_rss_bytes`` (the
    process's maximum resident set, CPU) and ``cuda_max_allocated_bytes`` (CUDA runs)."""
    out: dict[str, int] = {}
    with contextlib.suppress(Exception):
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
        out["peak_rss_bytes"] = int(kb) * (1 if sys.platform == "darwin" else 1024)
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):
        if torch is not None and torch.cuda.is_initialized():
            out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def _jsonable(x: Any) -> float | str:  # (json's default hook: any object)
    if isinstance(x, float):
        return x
    with contextlib.suppress(Exception):
        return float(x)
    return repr(x)


def _engine_pending(obs: Observer) -> dict[str, int]:
    """The DeepSpeed ``engine.backward`` calls since the last ``engine.step()`` call (and the
    ``engine.step()`` calls of the open window), when there are any: a run that never
    called ``engine.step()`` shows here (F14, never stepped)."""
    w = obs._w
    if not w.engine_bw_since_step:
        return {}
    return {"engine_backwards_pending": int(w.engine_bw_since_step),
            "engine_step_calls_pending": int(w.engine_step_calls)}
