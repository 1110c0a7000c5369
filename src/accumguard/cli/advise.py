"""``accumguard advise [--steps N] [--memory-budget 8GB] -- COMMAND ...``: the thin CLI.

Runs :func:`accumguard.advise.run_advise` and prints one row per mode (seconds per
optimizer step, collectives and bytes per step, peak memory, whether the updates equal the
command's own), the recommendation with the exact call that gives it, and writes JSON
(``--json``) and a PNG of time against memory (``--png``, matplotlib if installed).
Exit codes: 0 measured (a recommendation or not), 2 usage error or the command failed.
The user's files are never changed: each mode is applied inside the processes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TextIO

from accumguard.advise import AdviseOptions, AdviseReport, ModeResult, run_advise
from accumguard.core.errors import AccumguardError

__all__ = ["advise_main", "build_parser", "format_text", "parse_bytes"]

EXIT_OK, EXIT_ERROR = 0, 2

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "t": 1e12, "tb": 1e12}


def parse_bytes(text: str) -> int:
    """``8GB``, ``512MiB``, ``1e9`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 8GB or 512MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="accumguard advise",
        description="Run your unmodified training command for a few optimizer steps under "
                    "each communication mode its engine allows (DDP: sync every micro-step / "
                    "deferred; FSDP2: every micro-step / deferred / unsharded window; DeepSpeed "
                    "ZeRO: coalesced reduction, contiguous gradients, overlap, ZeRO-3 "
                    "parameter persistence), "
                    "measure time, collectives, memory and whether the updates equal your "
                    "script's, and recommend the fastest mode that fits the memory budget. "
                    "Your files are never changed.",
        epilog="example: accumguard advise --memory-budget 8GB -- torchrun --nproc-per-node 2 "
               "train.py   (see docs/advise.md)")
    p.add_argument("--steps", type=int, default=6,
                   help="optimizer steps per run; the first is warm-up (default 6)")
    p.add_argument("--memory-budget", type=parse_bytes, default=None, metavar="SIZE",
                   help="largest peak memory a recommended mode may use (e.g. 8GB); "
                        "CUDA max allocated on GPU, peak RSS per process on CPU")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these modes (names as in the table; the command as "
                        "written always runs)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="plot seconds per step against peak memory (needs matplotlib)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep each mode's recording in DIR/<mode>")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    return p


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{int(n)} B"


def _row(r: ModeResult) -> str:
    if r.error is not None:
        said = r.error if r.error.startswith("not run") else f"failed: {r.error}"
        return f"{r.mode.name:<28} {said}"
    t = ("-" if r.median_s is None else
         f"{r.median_s:.3f} s ({min(r.seconds):.3f}-{max(r.seconds):.3f})")
    same = {True: "equal", False: f"DIFFER ({r.update_rel_diff:.2g})", None: "-"}[r.equal]
    fits = "" if r.fits else "  over budget"
    return (f"{r.mode.name:<28} {t:<26} {r.grad_calls or 0:>5g} / {_size(r.grad_bytes):<9} "
            f"{r.param_calls or 0:>5g} / {_size(r.param_bytes):<9} {_size(r.peak_bytes):<9} "
            f"{same}{fits}")


def format_text(rep: AdviseReport) -> str:
    mem = next((r.memory_kind for r in rep.results if r.memory_kind), "memory")
    lines = [f"engine {rep.engine}, K={rep.k} micro-steps per optimizer step, "
             f"{rep.world} rank(s); seconds per optimizer step: median (min-max) after a "
             "warm-up step",
             f"{'mode':<28} {'s/step':<26} {'grad coll/bytes':<17} {'param coll/bytes':<17} "
             f"{'peak':<9} updates vs as written",
             *(_row(r) for r in rep.results),
             f"(peak: {mem}, largest rank; updates compared with tolerance {rep.tolerance:g})"]
    if rep.why_not:
        lines.append(f"no other mode applies: {rep.why_not}")
    best = rep.recommended
    if best is None:
        lines.append("no recommendation: no mode measured equal updates within the budget")
    else:
        base = rep.results[0].median_s
        gain = (f", {base / best.median_s:.2f}x the speed of the command as written"
                if base and best.median_s and best is not rep.results[0]
                and rep.basis == "fastest median" else "")
        lines.append(f"recommended: {best.mode.name} ({best.mode.what}{gain}): {best.mode.how}")
        if rep.basis and rep.basis != "fastest median":
            lines.append(f"  why: {rep.basis}")
    return "\n".join(lines)


def write_plot(rep: AdviseReport, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rep.results:
        if r.median_s is not None and r.peak_bytes is not None:
            ax.scatter(r.peak_bytes / 1e6, r.median_s)
            ax.annotate(r.mode.name, (r.peak_bytes / 1e6, r.median_s))
    mem = next((r.memory_kind for r in rep.results if r.memory_kind), "memory")
    ax.set_xlabel(f"{mem} (MB)")
    ax.set_ylabel("seconds per optimizer step (median)")
    ax.set_title(f"accumguard advise: {rep.engine}, K={rep.k}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def advise_main(argv: list[str] | None = None, *, stream: TextIO | None = None) -> int:
    out = stream or sys.stdout
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        opts = AdviseOptions(command=command, steps=args.steps, timeout=args.timeout,
                             memory_budget=args.memory_budget, only=args.only,
                             out_dir=Path(args.keep) if args.keep else None)
        rep = run_advise(opts)
    except (ValueError, AccumguardError) as exc:
        print(f"accumguard advise: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(format_text(rep), file=out)
    if args.json:
        Path(args.json).write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    if args.png and not write_plot(rep, args.png):
        print("accumguard advise: no PNG (pip install matplotlib)", file=sys.stderr)
    return EXIT_OK
