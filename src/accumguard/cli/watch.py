"""``accumguard watch [options] -- COMMAND ...``: run an unmodified training command with
the observation layer injected into every rank, then report findings.

Exit code: 1 when an error-level finding exists, else the command's own exit code when it
failed (2 when it could not be started), else :data:`EXIT_ACCUMGUARD_FAILED` (3) when
accumguard itself failed on a rank (the run went on unobserved from there; the report says
what was not checked), else 0. The command's stdout/stderr pass through untouched;
accumguard's report goes to stderr (and ``--json``). SIGINT/SIGTERM are forwarded to
the command's process group, so no rank is left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["EXIT_ACCUMGUARD_FAILED", "build_parser", "watch_main"]

#: accumguard's own failure: observation switched itself off on a rank; the run was unchanged.
EXIT_ACCUMGUARD_FAILED = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="accumguard watch",
        description="Run COMMAND (python, torchrun, deepspeed, accelerate launch) unmodified "
                    "with accumguard's observation layer in every rank; report accumulation "
                    "bugs (class, rank, step, micro-step, evidence, fix).")
    p.add_argument("--accumulation-steps", "-k", type=int, default=None, metavar="K",
                   help="micro-steps per optimizer step (default: what the run declares, "
                        "else inferred from the observed pattern)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    p.add_argument("--every", type=int, default=1, metavar="N",
                   help="check gradient conservation on every N-th optimizer step (default 1)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep the per-rank recordings in DIR (default: a temporary folder)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    return p


def watch_main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("accumguard watch: error: no command given; usage: accumguard watch -- python "
              "train.py", file=sys.stderr)
        return 2
    if args.accumulation_steps is not None and args.accumulation_steps < 1:
        print("accumguard watch: error: --accumulation-steps must be >= 1", file=sys.stderr)
        return 2
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        print(f"accumguard watch: error: command not found: {command[0]!r}", file=sys.stderr)
        return 127
    from accumguard.runtime.watch import observed_env

    tmp = None
    if args.keep:
        out_dir = Path(args.keep)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("rank-*.jsonl"):
            old.unlink()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="accumguard-watch-")
        out_dir = Path(tmp.name)
    try:
        env = observed_env(None, out_dir, every=args.every)
        code, signalled = _run(command, env)
        return _report(out_dir, args, code, signalled)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _run(command: list[str], env: dict[str, str]) -> tuple[int, str | None]:
    """Run in a new process group; forward SIGINT/SIGTERM to the group; reap it all."""
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=True)
    except (FileNotFoundError, PermissionError) as exc:
        print(f"accumguard watch: error: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127, None
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        _kill_group(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handled by the forwarder
                continue
        if received:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _group_alive(proc.pid):
                time.sleep(0.1)
            _kill_group(proc.pid, signal.SIGKILL)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    sig = None
    if code < 0:
        sig = signal.Signals(-code).name
        code = 128 - code
    elif received:
        sig = signal.Signals(received[0]).name
    return code, sig


def _kill_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _report(out_dir: Path, args: argparse.Namespace, code: int, signalled: str | None) -> int:
    from accumguard.runtime.watch_declared import declared_k
    from accumguard.runtime.watch_findings import (
        NUMBERING,
        analyze,
        collective_positions,
        load_recordings,
    )

    rec = load_recordings(out_dir)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    script = None
    if not args.accumulation_steps:
        script = declared_k(command, world=max(1, rec.world))
    findings, k, k_source = analyze(rec, k_flag=args.accumulation_steps, script=script)
    steps = {r: s for r, s in rec.steps.items()}
    n_steps = max((len(s) for s in steps.values()), default=0)
    errors = [f for f in findings if f.severity == "error"]
    problems = []
    if signalled:
        problems.append(f"the command was killed by {signalled} (exit code {code})")
    elif code != 0:
        problems.append(f"the command exited with code {code}")
    if signalled or code != 0:
        problems += collective_positions(rec)
    backwards = sum(int(s.get("backwards", 0)) for ss in rec.steps.values() for s in ss)
    if rec.failures:
        pass  # what was (not) checked is said by the failure lines, first
    elif n_steps == 0:
        backwards = sum(int(e.get("backwards_total", 0)) for e in rec.end.values())
        seen = (f"{backwards} backward passes" if backwards else "no backward pass either"
                + ("" if signalled or code != 0 else
                   ": is this a training command that uses torch?"))
        why = (f"the command was killed by {signalled} before any optimizer step" if signalled
               else f"the command exited with code {code} before any optimizer step"
               if code != 0 else "the command finished (exit code 0) without an optimizer step")
        # first, in place of the bare exit code: an empty report must not read as a pass
        problems = [f"nothing was checked: {why}; no optimizer step was observed ({seen})",
                    *(p for p in problems if not p.startswith("the command "))]
    elif backwards == 0:
        problems.append(f"nothing was checked: {n_steps} optimizer step(s) but no backward pass "
                        "before any of them (gradients made another way, e.g. "
                        "torch.autograd.grad into .grad, are not followed); the absence of "
                        "findings below says nothing about this run")
    failed = _failure_lines(rec)
    report = {
        "accumguard_failed": failed,
        "command": list(args.command),
        "exit_code": code,
        "signal": signalled,
        "ranks": rec.ranks,
        "checked": n_steps > 0 and backwards > 0,
        "accumulation_steps": k,
        "accumulation_steps_source": k_source,
        "script_declaration": None if script is None else {
            "name": script.name, "value": script.value, "path": script.path,
            "line": script.line, "how": script.how, "divides_loss": script.divides_loss},
        "numbering": NUMBERING,
        "engine": {str(r): v for r, v in rec.engine.items()},
        "findings": [f.as_dict() for f in findings],
        "problems": problems,
        "steps": _summary(rec),
        "epochs": _epochs(rec),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    _print(report, findings)
    if errors:
        return 1
    if code == 0 and failed:
        return EXIT_ACCUMGUARD_FAILED
    return code


def _epochs(rec: Any) -> list[dict[str, Any]]:
    """Per pass over a DataLoader on the first rank: micro-batches, optimizer steps,
    scheduler steps, and the window sizes (empty when no DataLoader pass was seen)."""
    from accumguard.observe._epochs import epochs

    rank = min(rec.steps, default=0)
    pending = int(rec.end.get(rank, {}).get("pending_backwards", 0) or 0)
    return [e.as_dict() for e in epochs(rec.steps.get(rank, []), rec.schedulers.get(rank, []),
                                        pending)]


def _failure_lines(rec: Any) -> list[str]:
    """What accumguard's own failures mean for this report, first thing the user reads."""
    if not rec.failures:
        return []
    lines = []
    for rank in sorted(rec.failures):
        f = rec.failures[rank]
        lines.append(f"accumguard FAILED on rank {rank} (its own error, not your script's): "
                     f"{f.get('error')} in {f.get('where')}, after {f.get('step')} optimizer "
                     "step(s); observation was switched off there and the run went on "
                     "unchanged")
    cut = rec.observed_steps or 0
    checked = (f"only the first {cut} optimizer step(s) were checked; nothing after them was "
               "(no finding about them means nothing)" if cut else
               "no optimizer step was checked (no finding means nothing about this run)")
    lines.append(f"{checked}. Please report this with the traceback below (kept with "
                 "--keep DIR in rank-R.jsonl)")
    first = rec.failures[min(rec.failures)]
    tb = str(first.get("traceback") or "").rstrip().splitlines()
    lines += ["  " + t for t in tb[-12:]]
    return lines


def _summary(rec: Any) -> list[dict[str, Any]]:
    rows = []
    rank0 = rec.steps.get(min(rec.steps), []) if rec.steps else []
    for s in rank0:
        cons = s.get("conservation") or {}
        mixed = _ranks_mixed(s, cons)
        rows.append({"step": int(s["step"]) + 1, "backwards": s["backwards"], "applied": s["applied"],
                     "scheduler_steps": s.get("scheduler_steps", 0),
                     "grad_collective_rounds": s.get("reduction_rounds", 0),
                     "conservation_error": cons.get("received") if cons and not mixed else None,
                     "conservation_not_judged": "the script's own collectives mixed other "
                     "ranks' gradients into .grad" if mixed else None,
                     "window_loss": s.get("window_loss")})
    return rows


def _ranks_mixed(step: dict[str, Any], cons: dict[str, Any]) -> bool:
    """A window whose .grad the script itself all-reduced on a model no engine averages
    (a hand-written data parallelism): what the optimizer received holds the other ranks'
    gradients, so its distance from this rank's backwards is not an error (nor a verdict)."""
    return (bool(cons) and int(step.get("reductions", 0)) > 0
            and step.get("engine", "local") == "local" and bool(cons.get("ok", False))
            and float(cons.get("received", 0.0)) > 1e-3)  # a wipe (F2/F3) keeps its number


def _no_finding_line(report: dict[str, Any]) -> str:
    """What an empty list of findings means, in words that match what was checked."""
    if not report.get("checked", True):
        return "nothing was checked (see above): no finding says nothing about this run"
    if report.get("accumguard_failed"):
        return ("no accumulation finding in the steps checked, but accumguard failed (see the "
                "first lines)")
    code, n = report.get("exit_code", 0), len(report["steps"])
    if report.get("signal") or code:
        return (f"no accumulation finding in the {n} optimizer step(s) recorded before the "
                "command ended (see above)")
    return "no accumulation finding"


def _print(report: dict[str, Any], findings: list[Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency of the cli extra
        Console = None  # type: ignore[assignment,misc]  # noqa: N806
    k = report["accumulation_steps"]
    lines = [f"accumguard watch: {len(report['ranks'])} rank(s), "
             f"{len(report['steps'])} optimizer step(s) "
             + ("observed before accumguard failed " if report.get("accumguard_failed") else "")
             + f"on rank {min(report['ranks'], default=0)} (all optimizers' steps)"
             + (f", K = {k} ({report['accumulation_steps_source']})" if k is not None else "")]
    lines += [f"  {p}" for p in report["problems"]]
    if Console is None:
        print("\n".join(report.get("accumguard_failed", []) + lines), file=sys.stderr)
        if not findings:
            print(_no_finding_line(report), file=sys.stderr)
        for f in findings:
            print(f"  [{f.severity}] {f.cls} rank {f.rank} step {f.step} micro {f.micro}: "
                  f"{f.evidence}. Fix: {f.fix}", file=sys.stderr)
        return
    console = Console(stderr=True, highlight=False)
    for line in report.get("accumguard_failed", []):
        console.print(line, markup=False, style="bold red")
    for line in lines:
        console.print(line, markup=False)
    if report["steps"]:
        t = Table(title="per optimizer step (first rank; steps from 1; sched: scheduler steps "
                        "since the previous optimizer step, so one made right after step n "
                        "shows on step n+1; coll.: backwards or flushes that issued "
                        "torch.distributed collectives from Python, the script's or "
                        "DeepSpeed's, DDP's bucket all-reduces run in C++ and are not "
                        "counted; conservation err: '-' when not sampled or not judged)")
        for col in ("step", "backwards", "applied", "sched", "coll.", "conservation err"):
            t.add_column(col)
        for row in report["steps"][:50]:
            ce = row["conservation_error"]
            t.add_row(str(row["step"]), str(row["backwards"]), str(row["applied"]),
                      str(row["scheduler_steps"]), str(row["grad_collective_rounds"]),
                      "-" if ce is None else f"{ce:.1e}")
        console.print(t)
    if not findings:
        console.print(_no_finding_line(report), markup=False)
    # the same finding on several ranks (same class, step and evidence) is printed once
    same: dict[tuple[Any, ...], list[int]] = {}
    for f in findings:
        if f.rank is not None:
            same.setdefault((f.cls, f.severity, f.step, f.micro, f.evidence), []).append(f.rank)
    for f in findings:
        ranks = same.get((f.cls, f.severity, f.step, f.micro, f.evidence)) \
            if f.rank is not None else None
        if ranks is not None and f.rank != ranks[0]:
            continue
        where = ("all ranks" if f.rank is None else f"rank {f.rank}" if len(ranks or []) < 2
                 else f"ranks {', '.join(map(str, ranks or []))}")
        where += f", step {f.step}" if f.step is not None else ""
        where += f", micro-step {f.micro}" if f.micro is not None else ""
        console.print(f"[{'red' if f.severity == 'error' else 'yellow'}]{f.severity.upper()} "
                      f"{f.cls}[/] — {f.title} ({where})")
        console.print(f"  evidence: {f.evidence}", markup=False)
        console.print(f"  fix: {f.fix}", markup=False)
