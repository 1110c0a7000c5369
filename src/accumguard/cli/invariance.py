"""``accumguard invariance --ks 1,4 [--batch B] -- COMMAND ...``: the thin CLI.

Parses arguments, runs :func:`accumguard.invariance.run_invariance`, and
presents the report: a table (rich when installed, plain text otherwise), a PNG
of the loss curves and of the relative update difference per step
(matplotlib, optional), JSON. Exit codes: 0 every K agrees with the first
within the tolerance, 1 a K diverged, 2 usage error or the command failed (its
own exit code is in the message), 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, TextIO

from accumguard.core.errors import AccumguardError, ConfigError
from accumguard.invariance import (
    CommandFailedError,
    InvarianceOptions,
    InvarianceReport,
    parse_ks,
    run_invariance,
)

__all__ = ["invariance_main", "build_parser", "format_text", "print_report", "write_plot"]

EXIT_OK, EXIT_FAIL, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

_EPILOG = """\
placeholders in COMMAND: {K} accumulation steps, {MB} micro-batch (= --batch / K);
also exported as ACCUMGUARD_K and ACCUMGUARD_MICRO_BATCH.
examples:
  accumguard invariance --ks 1,4 --batch 16 -- python train.py --accum {K} --bs {MB}
  accumguard invariance --ks 1,4 --batch 8 -- torchrun --nproc-per-node 2 train.py \\
      --gradient_accumulation_steps {K} --per_device_train_batch_size {MB}
steps are numbered from 1 (step 1 is the first optimizer step). See docs/invariance.md.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="accumguard invariance",
        description="Run your unmodified training command once per K at one effective batch "
                    "(same seeds) and compare the window loss and the parameter update of "
                    "every optimizer step with the first K. Exit 1 on divergence.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", default="1,4", help="comma-separated K values; the first is the "
                                               "reference (default 1,4)")
    p.add_argument("--steps", type=int, default=3,
                   help="optimizer steps per run (default 3)")
    p.add_argument("--batch", type=int, default=None, metavar="B",
                   help="per-rank effective batch: samples per optimizer step on one rank; "
                        "{MB} = B / K (B must be divisible by every K)")
    p.add_argument("--no-dropout", action="store_true",
                   help="replace dropout by identity in the command's processes (dropout masks "
                        "depend on the micro-batch shape, so they differ between K)")
    p.add_argument("--tolerance", type=float, default=None, metavar="X",
                   help="relative difference allowed per step (default: from the parameters' "
                        "dtype, 1e-4 for fp32; stated in the report)")
    p.add_argument("--timeout", type=float, default=900.0, metavar="S",
                   help="kill a run (with every process it started) after S seconds "
                        "(default 900)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed set in every process of every run (default 0)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="write a PNG: loss curves and update difference per step")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep the per-K recordings in DIR (default: a temporary folder)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the training command, after `--`")
    return p


# ----------------------------------------------------------------------------- presentation
def _f(x: Any, spec: str = ".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        return format(x, spec)
    if isinstance(x, list):
        return ",".join(map(str, x)) if len(set(x)) > 1 else (str(x[0]) if x else "-")
    return str(x)


_COLUMNS = ("step", "K", "loss K={ref}", "loss K", "loss rel diff", "update rel diff",
            "bwd/rank", "verdict")


def _header(report: InvarianceReport) -> list[str]:
    ref = report.ks[0]
    world = report.runs[0].world_size if report.runs else 0
    batch = f"per-rank batch {report.batch}" if report.batch else "batch set by the script"
    lines = [f"accumguard invariance: K in {list(report.ks)} against K={ref}, {batch}, "
             f"{world} rank(s), {report.steps} optimizer step(s) per run"
             + (", dropout off" if report.no_dropout else ""),
             f"tolerance {report.tolerance:.3g} ({report.tolerance_reason})"]
    if report.diverged:
        for c in report.comparisons:
            if not c.diverged:
                continue
            s = c.steps[c.first_divergent_step - 1]  # type: ignore[operator]
            what = (f"relative update difference {_f(s.update_rel_diff)}"
                    if s.decided_by == "update"
                    else f"relative window-loss difference {_f(s.loss_rel_diff)}")
            lines.append(f"DIVERGED: K={c.k} differs from K={ref} from step "
                         f"{c.first_divergent_step} on ({what} > "
                         f"{s.tolerance if s.tolerance is not None else report.tolerance:.3g})")
    for c in report.comparisons:
        if c.by_construction:
            found = report.findings.get(c.k, [])
            errors = sorted({str(f.get("cls")) for f in found if f.get("severity") == "error"})
            lines.append(f"NOT K-INVARIANT BY CONSTRUCTION: K={c.k} differs from K={ref} from "
                         f"step {c.first_divergent_step} on (max relative update difference "
                         f"{_f(c.max_update_rel_diff)}), expected from the script itself: "
                         f"{'; '.join(c.construction)}. Not an accumulation bug; the "
                         f"accumulation checks of watch on this run: "
                         + (f"errors {', '.join(errors)}" if errors else "no error"))
    if not report.diverged and not report.by_construction:
        worst = [c.max_update_rel_diff for c in report.comparisons
                 if c.max_update_rel_diff is not None]
        lines.append(f"OK: every K agrees with K={ref} at every step (max relative update "
                     f"difference {_f(max(worst)) if worst else 'not recorded'})")
    return lines


def _rows(report: InvarianceReport) -> list[list[str]]:
    rows = []
    for c in report.comparisons:
        differs = "differs (by construction)" if c.construction else "DIVERGED"
        for s in c.steps:
            verdict = (differs if s.diverged else "ok") if s.decided_by else "-"
            rows.append([str(s.step), str(c.k), _f(s.loss_ref, ".6g"), _f(s.loss, ".6g"),
                         _f(s.loss_rel_diff), _f(s.update_rel_diff),
                         f"{_f(s.backwards_ref)}|{_f(s.backwards)}", verdict])
    return rows


def _footer(report: InvarianceReport) -> list[str]:
    lines = [f"warning: {w}" for w in report.warnings]
    for r in report.runs:
        lines += [f"note (K={r.k}): {n}" for n in r.notes]
    for c in report.comparisons:
        lines += [f"note (K={c.k}): {n}" for n in c.notes]
    for k, text in report.findings_text.items():
        if text.strip():
            lines.append(f"watch findings for the K={k} run:")
            lines += ["  " + line for line in text.rstrip().splitlines()]
        elif not report.findings.get(k):
            lines.append(f"watch findings for the K={k} run: none (the boundary contract held; "
                         "the difference is in what the micro-steps compute, e.g. the loss "
                         "normalisation, F5)")
    return lines


def _column_names(report: InvarianceReport) -> list[str]:
    return [c.format(ref=report.ks[0]) for c in _COLUMNS[:-2]] + [
        f"bwd/rank K={report.ks[0]}|K", "verdict"]


def format_text(report: InvarianceReport) -> str:
    """The report as plain text (what is printed when rich is not installed)."""
    cols = _column_names(report)
    rows = _rows(report)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(cols)]
    out = _header(report)
    out.append("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    out += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    out += _footer(report)
    return "\n".join(out)


def print_report(report: InvarianceReport, file: TextIO | None = None) -> None:
    """Print ``report``: a rich table when rich is installed, plain text otherwise."""
    file = file if file is not None else sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(format_text(report), file=file)
        return
    console = Console(file=file, width=max(120, Console(file=file).width))
    head = _header(report)
    for i, line in enumerate(head):
        style = None
        if line.startswith("DIVERGED"):
            style = "bold red"
        elif line.startswith("OK"):
            style = "bold green"
        console.print(line, style=style, highlight=False, markup=False, soft_wrap=i == 0)
    table = Table(show_lines=False)
    for name in _column_names(report):
        table.add_column(name, justify="right")
    for row in _rows(report):
        table.add_row(*row, style="red" if row[-1] == "DIVERGED" else None)
    console.print(table)
    for line in _footer(report):
        console.print(line, style="yellow" if line.startswith("warning") else None,
                      highlight=False, markup=False)


def write_plot(report: InvarianceReport, path: Path) -> Path | None:
    """Loss curves per K and the relative update difference per step; None without
    matplotlib (a note says how to install it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed, no plot written "
              "(pip install 'accumguard[plot]')", file=sys.stderr)
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    n = len(report.ks)
    for i, run in enumerate(report.runs):
        xs = [j + 1 for j, s in enumerate(run.steps) if s.window_loss is not None]
        ys = [s.window_loss for s in run.steps if s.window_loss is not None]
        mb = f", micro-batch {run.micro_batch}" if run.micro_batch else ""
        ax1.plot(xs, ys, marker="o", ms=3 + 2 * (n - i), alpha=0.7, label=f"K={run.k}{mb}")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("window loss (sum over micro-steps and ranks)")
    ax1.set_title("loss as the script computed it", fontsize=9)
    ax1.legend(fontsize=8)
    floor = report.tolerance * 1e-3
    for c in report.comparisons:
        pts = [(s.step, max(s.update_rel_diff, floor)) for s in c.steps
               if s.update_rel_diff is not None and math.isfinite(s.update_rel_diff)]
        if not pts:
            pts = [(s.step, max(s.loss_rel_diff, floor)) for s in c.steps
                   if s.loss_rel_diff is not None and math.isfinite(s.loss_rel_diff)]
        if pts:
            ax2.plot(*zip(*pts, strict=True), marker="o", label=f"K={c.k} vs K={c.k_ref}")
    ax2.axhline(report.tolerance, color="red", ls="--", lw=1,
                label=f"tolerance {report.tolerance:.1e}")
    ax2.set_yscale("log")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("||Δθ_K − Δθ_ref|| / ||Δθ_ref||")
    first = report.first_divergent_step
    ax2.set_title("relative update difference" + (f": diverges at step {first}" if first
                                                  else ": within tolerance"), fontsize=9)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- the command
def _split(argv: list[str]) -> tuple[list[str], list[str] | None]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def invariance_main(argv: list[str]) -> int:
    """``accumguard invariance``: returns the exit code."""
    parser = build_parser()
    head, command = _split(list(argv))
    try:
        args = parser.parse_args(head)
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, (int, type(None))) else EXIT_ERROR
    if command is None:
        command = list(args.command)
    elif args.command:
        parser.print_usage(sys.stderr)
        print(f"accumguard invariance: error: unexpected arguments before `--`: "
              f"{' '.join(args.command)}", file=sys.stderr)
        return EXIT_ERROR
    try:
        opts = InvarianceOptions(command=tuple(command), ks=parse_ks(args.ks), steps=args.steps,
                                 batch=args.batch, no_dropout=args.no_dropout,
                                 tolerance=args.tolerance, timeout=args.timeout, seed=args.seed,
                                 workdir=Path(args.keep) if args.keep else None)
        report = run_invariance(opts)
    except CommandFailedError as exc:
        print(f"accumguard invariance: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (ConfigError, AccumguardError) as exc:
        print(f"accumguard invariance: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        print(f"accumguard invariance: interrupted ({exc or 'SIGINT'})", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_report(report)
    if args.json:
        print(f"json: {report.write_json(Path(args.json))}")
    if args.plot:
        written = write_plot(report, Path(args.plot))
        if written is not None:
            print(f"plot: {written}")
    return report.exit_code
