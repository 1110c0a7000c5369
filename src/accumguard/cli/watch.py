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
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["EXIT_ACCUMGUARD_FAILED", "JSON_SCHEMA_VERSION", "build_parser", "watch_main"]

from accumguard.watch._report import EXIT_ACCUMGUARD_FAILED, JSON_SCHEMA_VERSION


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
    p.add_argument("--observe-steps", type=int, default=None, metavar="N",
                   help="observe each rank for its first N optimizer steps, longer while the "
                        "end of its first pass over a DataLoader is within reach, then let it "
                        "run on with nothing of accumguard in it (default 64; 0: every step)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep the per-rank recordings in DIR (default: a temporary folder)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="several nodes: a directory every node's watch shares (never cleared); "
                        "each watch reports its own ranks, then `accumguard watch --report DIR` "
                        "judges the whole job")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="no command: judge the rank records in DIR (left by --out or --keep) "
                        "as one job")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    return p


def watch_main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.report is not None:
        return _report_only(Path(args.report), args, command)
    if not command:
        print("accumguard watch: error: no command given; usage: accumguard watch -- python "
              "train.py", file=sys.stderr)
        return 2
    if args.keep and args.out:
        print("accumguard watch: error: --keep and --out both given; use --out DIR on every "
              "node of a multi-node job, --keep DIR otherwise", file=sys.stderr)
        return 2
    if args.accumulation_steps is not None and args.accumulation_steps < 1:
        print("accumguard watch: error: --accumulation-steps must be >= 1", file=sys.stderr)
        return 2
    if args.observe_steps is not None and args.observe_steps < 0:
        print("accumguard watch: error: --observe-steps must be >= 0 (0: every step)",
              file=sys.stderr)
        return 2
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        print(f"accumguard watch: error: command not found: {command[0]!r}", file=sys.stderr)
        return 127
    from accumguard.watch._recording import OBSERVE_STEPS
    from accumguard.watch._report import watch

    observe = OBSERVE_STEPS if args.observe_steps is None else args.observe_steps or None
    return _emit(watch(command, accumulation_steps=args.accumulation_steps, every=args.every,
                       keep=args.keep, out=args.out, observe_steps=observe), args)


def _report_only(out_dir: Path, args: argparse.Namespace, command: list[str]) -> int:
    """``--report DIR``: the records every node's watch left in one shared directory,
    judged as one job (the rules that compare ranks see every rank)."""
    from accumguard.watch._report import judge

    if command:
        print("accumguard watch: error: --report DIR takes no command (it reads the records "
              f"a finished job left in {str(out_dir)!r})", file=sys.stderr)
        return 2
    if not out_dir.is_dir() or not any(out_dir.glob("rank-*.jsonl")):
        print(f"accumguard watch: error: no rank records (rank-*.jsonl) in {str(out_dir)!r}; "
              "expected the directory given as --out (or --keep) to the watch of every node",
              file=sys.stderr)
        return 2
    return _emit(judge(out_dir, accumulation_steps=args.accumulation_steps, merged=True), args)


def _emit(result: Any, args: argparse.Namespace) -> int:
    if args.json:
        Path(args.json).write_text(json.dumps(result.report, indent=2, default=str),
                                   encoding="utf-8")
    _print(result.report, result.findings)
    return int(result.exit_code)


def _no_finding_line(report: dict[str, Any]) -> str:
    """What an empty list of findings means, in words that match what was checked."""
    if not report.get("checked", True):
        return "nothing was checked (see above): no finding says nothing about this run"
    if report.get("accumguard_failed"):
        return ("no accumulation finding in the steps checked, but accumguard failed (see the "
                "first lines)")
    if report.get("ranks_without_steps"):
        return ("no accumulation finding on the rank(s) that stepped (rank(s) "
                f"{', '.join(map(str, report['ranks_without_steps']))} made no optimizer step "
                "and were not judged, see above)")
    if report.get("ranks_missing"):
        return ("no accumulation finding on the rank(s) this report holds (the checks that "
                "compare ranks were incomplete, see above)")
    code, n = report.get("exit_code", 0), len(report["steps"])
    if report.get("signal") or code:
        return (f"no accumulation finding in the {n} optimizer step(s) recorded before the "
                "command ended (see above)")
    return "no accumulation finding"


def _conservation_cell(row: dict[str, Any]) -> str:
    """The measured conservation error; ``clipped`` for a window clipped after its last
    backward (its distance is the clip's doing); ``-`` when not sampled or not judged."""
    ce = row["conservation_error"]
    if ce is not None:
        return f"{ce:.1e}"
    return "clipped" if str(row.get("conservation_not_judged") or "").startswith("clipped") \
        else "-"


def _optimizer_cell(row: dict[str, Any]) -> str:
    """``AdamW #1``: the optimizer of a step row (no number before the optimizers were told
    apart: the first steps' shared window)."""
    idx = row.get("optimizer_index")
    return f"{row.get('optimizer') or '?'}" + ("" if idx is None else f" #{idx}")


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
             + f"on rank {min(report['ranks'], default=0)} (all optimizers' steps"
             + (f"; {report['steps_in_backward']} more ran inside backward passes, not judged"
                if report.get("steps_in_backward") else "") + ")"
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
                        "counted; conservation err: '-' when not sampled or not judged, "
                        "'clipped' when clipped after the window's last backward)")
        # several optimizers over disjoint parameters: each row is one optimizer's step,
        # its backwards those of its own window (the same backwards for optimizers that
        # step together)
        several = len({r.get("optimizer_index") for r in report["steps"]} - {None}) > 1
        cols = ("step", *(("optimizer",) if several else ()), "backwards", "applied", "sched",
                "coll.", "conservation err")
        for col in cols:
            t.add_column(col)
        for row in report["steps"][:50]:
            t.add_row(str(row["step"]),
                      *((_optimizer_cell(row),) if several else ()),
                      str(row["backwards"]), str(row["applied"]),
                      str(row["scheduler_steps"]), str(row["grad_collective_rounds"]),
                      _conservation_cell(row))
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
