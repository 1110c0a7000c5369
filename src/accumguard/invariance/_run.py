"""``accumguard invariance``: running the command once per K (its own process group,
observed, seeded; killed with everything it started on timeout or signal) and turning
the recordings into the report."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from accumguard.invariance._options import (
    ENV_BATCH,
    ENV_K,
    ENV_MB,
    ENV_NO_DROPOUT,
    ENV_SEED,
    CommandFailedError,
    InvarianceOptions,
    check_command,
    expand_command,
    micro_batch,
)
from accumguard.invariance._records import RunRecord, load_run
from accumguard.invariance._report import InvarianceReport, build_report, watch_findings
from accumguard.runtime._child import run_group

__all__ = ["run_invariance"]


def _observer_env(observe_dir: Path, opts: InvarianceOptions) -> dict[str, str]:
    """The environment that makes every Python process of the command load the observer
    (recording updates, stopping after ``opts.steps`` steps); the same bootstrap applies
    the seed and dropout hooks from the variables :func:`_child_env` sets."""
    from accumguard.watch._recording import observed_env

    return observed_env(os.environ, observe_dir, record_updates=True, max_steps=opts.steps)


def _child_env(opts: InvarianceOptions, k: int, mb: int | None, observe_dir: Path
               ) -> dict[str, str]:
    env = dict(os.environ)
    env.update(_observer_env(observe_dir, opts))
    env.update({
        ENV_K: str(k),
        ENV_SEED: str(opts.seed),
        "PYTHONHASHSEED": str(opts.seed),
        "PYTHONUNBUFFERED": "1",
    })
    if mb is not None:
        env[ENV_MB] = str(mb)
        env[ENV_BATCH] = str(opts.batch)
    else:
        env.pop(ENV_MB, None)
        env.pop(ENV_BATCH, None)
    if opts.no_dropout:
        env[ENV_NO_DROPOUT] = "1"
    else:
        env.pop(ENV_NO_DROPOUT, None)
    return env


class _Interrupted(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _forward_signals() -> Iterator[None]:
    """Between the K runs, SIGTERM/SIGINT stop the whole comparison (during a run they are
    forwarded to the command's group and then end it the same way)."""
    def handler(signum: int, _frame: Any) -> None:
        raise _Interrupted(signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: leave as is
                previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def _run_child(argv: list[str], env: dict[str, str], timeout: float, k: int
               ) -> tuple[int, float]:
    """Run one K's command in its own process group; stdout/stderr pass through untouched."""
    end = run_group(argv, env, timeout=timeout, grace=2.0)
    if end.start_error:
        raise CommandFailedError(end.start_error, k=k, exit_code=end.code)
    if end.interrupted:
        raise _Interrupted(signal.SIGTERM if end.signal == "SIGTERM" else signal.SIGINT)
    if end.timed_out:
        raise CommandFailedError(
            f"K={k}: the command did not finish within {timeout:.0f} s and was killed "
            "(with every process it started). It should stop by itself after --steps "
            "optimizer steps; raise --timeout if one run is genuinely that slow",
            k=k, exit_code=None)
    code = end.code if end.signal is None or end.code < 128 else 128 - end.code
    return code, end.seconds


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def run_invariance(opts: InvarianceOptions, *, stream: TextIO | None = None,
                   findings_for: Callable[[RunRecord], tuple[list[dict[str, Any]], str]]
                   | None = None) -> InvarianceReport:
    """Run the command once per K, load the recordings, compare with the first K.

    Raises :class:`ConfigError` for bad input before anything runs, and
    :class:`CommandFailedError` when a run fails, is killed, times out or never
    steps an optimizer (its exit code in the message). ``findings_for`` maps a
    run's recording directory to the observation layer's findings (watch);
    it is called for every run that diverged.
    """
    stream = stream if stream is not None else sys.stderr
    findings_for = findings_for if findings_for is not None else watch_findings
    notes = check_command(opts.command, batch=opts.batch)
    for n in notes:  # printed now: they matter most when the run then fails
        print(f"accumguard invariance: warning: {n}", file=stream, flush=True)
    t0 = time.monotonic()
    own_tmp = None
    if opts.workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="accumguard-invariance-")
        root = Path(own_tmp.name)
    else:
        root = Path(opts.workdir)
        root.mkdir(parents=True, exist_ok=True)
    runs: list[RunRecord] = []
    try:
        with _forward_signals():
            for k in opts.ks:
                mb = micro_batch(opts.batch, k) if opts.batch is not None else None
                argv = expand_command(opts.command, k, mb)
                observe_dir = root / f"k{k}"
                if observe_dir.exists():
                    shutil.rmtree(observe_dir)
                observe_dir.mkdir(parents=True)
                print(f"accumguard invariance: K={k}" + (f", micro-batch {mb}" if mb else "")
                      + f", {opts.steps} optimizer steps: {shlex.join(argv)}", file=stream,
                      flush=True)
                code, elapsed = _run_child(argv, _child_env(opts, k, mb, observe_dir),
                                           opts.timeout, k)
                run = load_run(observe_dir, k=k, micro_batch=mb, command=argv,
                               max_steps=opts.steps)
                run.exit_code, run.elapsed_s = code, elapsed
                _check_run(run, opts)
                runs.append(run)
        report = build_report(runs, command=opts.command, batch=opts.batch, steps=opts.steps,
                              tolerance=opts.tolerance, no_dropout=opts.no_dropout,
                              warnings_=notes)
        for comp in report.comparisons:
            # a script not K-invariant by construction: its accumulation is judged by the
            # watch checks of the run (the update comparison cannot)
            if comp.diverged or comp.by_construction:
                run = next(r for r in runs if r.k == comp.k)
                try:
                    found, text = findings_for(run)
                except Exception as exc:  # noqa: BLE001 - findings are an extra, not the verdict
                    report.warnings.append(f"K={comp.k}: watch findings unavailable "
                                           f"({type(exc).__name__}: {exc})")
                    continue
                report.findings[comp.k] = found
                report.findings_text[comp.k] = text
        report.elapsed_s = time.monotonic() - t0
        return report
    except _Interrupted as exc:
        name = signal.Signals(exc.signum).name
        raise KeyboardInterrupt(f"{name}: stopped; the command's processes were killed") from None
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()


def _check_run(run: RunRecord, opts: InvarianceOptions) -> None:
    code = run.exit_code
    assert code is not None
    steps = len(run.steps)
    if code != 0:
        raise CommandFailedError(
            f"K={run.k}: the command {_describe_exit(code)} after {steps} recorded optimizer "
            f"step(s): {shlex.join(run.command)}. Its output is above; fix the script (or the "
            "placeholders) and run again", k=run.k, exit_code=code)
    if run.world_size == 0:
        raise CommandFailedError(
            f"K={run.k}: the command exited with code 0 but no process of it ran a backward "
            f"pass or an optimizer step under the observation layer (nothing recorded in "
            f"{run.observe_dir}). Either the script never trains at this K (too little data "
            "for one window?), or the command does not start Python with the inherited "
            "environment (a wrapper that resets PYTHONPATH): run the Python launcher directly "
            "(python, torchrun, deepspeed, accelerate launch)", k=run.k, exit_code=0)
    if steps == 0:
        raise CommandFailedError(
            f"K={run.k}: the command exited with code 0 but never stepped an optimizer "
            f"({run.world_size} rank(s) observed, no optimizer step): nothing to compare. "
            "Does the script train for at least one optimizer step at this K "
            "(enough data for K micro-batches)?", k=run.k, exit_code=0)
    if steps < opts.steps:
        run.notes.append(f"only {steps} of {opts.steps} optimizer steps recorded (the script "
                         "ended first)")
