"""The ``accumguard`` command line: thin argparse over the library.

Subcommands::

    accumguard demo           the audit on a built-in model, across engines and loops
                              (--frameworks: HF Trainer, Lightning, Accelerate)
    accumguard audit          audit your own loop (accumguard.cli.audit)
    accumguard lint           static checks of training scripts (accumguard.cli.lint)
    accumguard check-config   checks of a DeepSpeed config (accumguard.cli.lint)
    accumguard watch          observe an unmodified training command (accumguard.cli.watch)
    accumguard invariance     your script at K = 1, 4, ... compared step by step (accumguard.cli.invariance)
    accumguard advise         your command under each communication mode, measured (accumguard.cli.advise)
    accumguard curves         loss curves for K = 1, 2, 4, 8 at one effective batch
    accumguard bench          the engine benchmark (benchmarks/bench_engines.py)

Exit codes: 0 success / as expected, 1 a check failed (a verdict not as expected,
findings), 2 the command could not run (bad arguments, missing module, a rank
crashed), with a one-line message on stderr. Every subcommand's module is
imported only when that subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

# Subcommands owned by other modules: (module, function), called with the remaining argv.
_DELEGATED = {
    "audit": ("accumguard.cli.audit", "audit_main",
              "audit your own training loop against the large-batch reference"),
    "lint": ("accumguard.cli.lint", "lint_main",
             "static checks of training scripts for accumulation bugs"),
    "check-config": ("accumguard.cli.lint", "check_config_main",
                     "check a DeepSpeed config for accumulation mistakes"),
    "invariance": ("accumguard.cli.invariance", "invariance_main",
                   "run your script once per K at one effective batch and compare every step"),
    "watch": ("accumguard.cli.watch", "watch_main",
              "run your unmodified training command and report accumulation bugs"),
    "advise": ("accumguard.cli.advise", "advise_main",
               "measure your command under each communication mode and recommend one"),
}


class _Error(Exception):
    """A one-line error for the user (exit code 2)."""


def _positive_seconds(text: str) -> float:
    from accumguard.cli.audit import positive_seconds

    return positive_seconds(text)


def build_parser() -> argparse.ArgumentParser:
    from accumguard import __version__

    p = argparse.ArgumentParser(
        prog="accumguard",
        description="Gradient accumulation that equals the large batch, and the audit that "
                    "catches it when it does not.")
    p.add_argument("--version", action="version", version=f"accumguard {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="audit correct and broken loops on DDP, FSDP2, ZeRO-1 and "
                                    "DeepSpeed, on a built-in model (no network)",
                       description="Run the audit on a built-in tiny causal LM: for each "
                                   "engine the Accumulator, a correct hand-written loop and "
                                   "broken loops; print a table, write a JSON report and a "
                                   "loss plot. Exit 0 when every verdict is as expected.")
    d.add_argument("--quick", action="store_true",
                   help="fewer engines (ddp, zero1 unless --engines), loops and steps")
    d.add_argument("--engines", default=None, metavar="LIST",
                   help="comma-separated: ddp, zero1, fsdp2 (both), fsdp2-zero2, fsdp2-zero3, "
                        "deepspeed (all), deepspeed-z1/z2/z3, all (default: all)")
    d.add_argument("--out", default="accumguard-out", metavar="DIR",
                   help="output folder for demo-report.json and the PNGs "
                        "(default ./accumguard-out)")
    d.add_argument("--no-plot", action="store_true", help="do not write the PNGs")
    d.add_argument("--no-story", action="store_true",
                   help="skip the story part (32 steps of the ZeRO-2 hand loop vs the large "
                        "batch; skipped anyway with --quick)")
    d.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per loop (default 3; 2 with --quick)")
    d.add_argument("--timeout", type=_positive_seconds, default=600.0,
                   help="kill the ranks of an engine family after S seconds (default 600)")
    d.add_argument("--frameworks", nargs="?", const="all", default=None, metavar="LIST",
                   help="instead of the engines: the transformers Trainer, Lightning and "
                        "Accelerate, each framework's broken default vs the accumguard way "
                        "(optional comma-separated subset; writes frameworks-report.json and "
                        "frameworks-update-error.png)")

    for name, (_, _, text) in _DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)

    c = sub.add_parser("curves", help="loss curves for K = 1, 2, 4, 8 at one effective batch "
                                      "(they must overlap)")
    c.add_argument("--ks", default="1,2,4,8", help="comma-separated K values (default 1,2,4,8)")
    c.add_argument("--steps", type=int, default=12, help="optimizer steps (default 12)")
    c.add_argument("--out", default="accumguard-out", metavar="DIR",
                   help="output folder for curves.json and curves.png")
    c.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    c.add_argument("--tolerance", type=float, default=1e-4,
                   help="exit 1 if the curves differ by more than this (default 1e-4)")

    sub.add_parser("bench", help="run benchmarks/bench_engines.py (options passed through)",
                   add_help=False)
    return p


def _delegate(name: str, argv: list[str]) -> int:
    module, func, _ = _DELEGATED[name]
    return int(_load(module, func, name)(argv))


def _load(module: str, func: str, command: str) -> Callable[[list[str]], int]:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise _Error(f"`accumguard {command}` is not available: cannot import {module} "
                     f"({exc}); reinstall accumguard (pip install -e .)") from exc
    fn: Callable[[list[str]], int] | None = getattr(mod, func, None)
    if fn is None:
        raise _Error(f"`accumguard {command}` is not available: {module} has no {func}()")
    return fn


def _demo(args: argparse.Namespace) -> int:
    if args.frameworks is not None:
        return _demo_frameworks(args)
    from accumguard.demo.demo import QUICK_ENGINES, DemoOptions, parse_engines, run_demo
    from accumguard.demo.loops import ENGINES

    if args.engines:
        engines = parse_engines(args.engines)
    else:
        engines = QUICK_ENGINES if args.quick else ENGINES
    opts = DemoOptions(engines=engines, quick=args.quick, out=Path(args.out),
                       plot=not args.no_plot, steps=args.steps, timeout=args.timeout,
                       story=False if args.no_story else None)
    return run_demo(opts).exit_code


def _demo_frameworks(args: argparse.Namespace) -> int:
    # A flag of the demo, not a subcommand: same purpose (broken vs accumguard against the
    # fp64 reference), same --out/--no-plot/--timeout; the engine options do not apply.
    from accumguard.demo.frameworks import parse_frameworks, run_frameworks_demo

    clash = [flag for flag, on in (("--engines", args.engines), ("--quick", args.quick),
                                   ("--no-story", args.no_story),
                                   ("--steps", args.steps is not None)) if on]
    if clash:
        raise _Error(f"{', '.join(clash)} select(s) engine runs and cannot be combined with "
                     "--frameworks; run `accumguard demo --frameworks` alone")
    result = run_frameworks_demo(parse_frameworks(args.frameworks), out_dir=Path(args.out),
                                 plot=not args.no_plot, timeout=args.timeout)
    return result.exit_code


def _curves(args: argparse.Namespace) -> int:
    from accumguard.demo.demo import run_curves

    try:
        ks = tuple(int(x) for x in args.ks.split(",") if x.strip())
    except ValueError as exc:
        raise _Error(f"--ks {args.ks!r} must be comma-separated integers, e.g. 1,2,4,8") from exc
    if not ks:
        raise _Error("--ks selects no K; e.g. --ks 1,2,4,8")
    result = run_curves(ks=ks, steps=args.steps, out_dir=Path(args.out), plot=not args.no_plot)
    if result.max_deviation > args.tolerance:
        print(f"curves differ by {result.max_deviation:.2e} > {args.tolerance:g}: accumulation "
              "is not equivalent across K", file=sys.stderr)
        return EXIT_FAIL
    print(f"curves overlap (max deviation {result.max_deviation:.2e} ≤ {args.tolerance:g})")
    return EXIT_OK


def _bench(argv: list[str]) -> int:
    # Runs in this process: the benchmark spawns its own ranks and owns its argument parser.
    from accumguard.demo.bench import main as bench_main

    return bench_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code (the console script passes it to ``sys.exit``)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args_list:
        parser.print_help()
        return EXIT_OK
    from accumguard.core.errors import AccumguardError

    try:
        command = args_list[0]
        # Delegated subcommands parse their own arguments (and their own --help).
        if command in _DELEGATED:
            return _delegate(command, args_list[1:])
        if command == "bench":
            return _bench(args_list[1:])
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # argparse: 0 for --help/--version, 2 for usage errors
            return int(exc.code or 0) if isinstance(exc.code, (int, type(None))) else EXIT_ERROR
        if args.command == "demo":
            return _demo(args)
        if args.command == "curves":
            return _curves(args)
        parser.print_help()
        return EXIT_OK
    except (_Error, AccumguardError) as exc:
        text = " ".join(str(exc).split())
        print(f"accumguard: error: {text}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("accumguard: interrupted", file=sys.stderr)
        return 130


def _console() -> None:  # pragma: no cover - the installed script
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
