"""Entry points for ``accumguard lint`` and ``accumguard check-config``.

Kept thin (argparse + exit codes) so the main CLI can mount them as
subcommands, and so they run without the optional CLI extras. Exit codes, the
same for both: 0 no findings, 1 findings, 2 usage or parse error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from accumguard.static.findings import RULES, filter_findings
from accumguard.static.lint.report import FORMATS, render

__all__ = ["build_check_config_parser", "build_lint_parser", "check_config_main", "lint_main"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _codes(values: Sequence[str] | None) -> list[str]:
    """Flatten repeated/comma-separated ``--select``/``--ignore`` values."""
    out: list[str] = []
    for v in values or ():
        out.extend(c.strip().upper() for c in v.split(",") if c.strip())
    return out


def _check_codes(parser: argparse.ArgumentParser, codes: list[str]) -> None:
    for c in codes:
        if not any(code.startswith(c) for code in RULES):
            parser.error(f"unknown rule code {c!r}; known codes: {', '.join(sorted(RULES))}")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="output format (text adds a help line per finding; concise is one line each)",
    )
    p.add_argument("--select", action="append", metavar="CODES", help="only these codes or prefixes (e.g. AG101,AG2)")
    p.add_argument("--ignore", action="append", metavar="CODES", help="skip these codes or prefixes")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")


def build_lint_parser(prog: str = "accumguard lint") -> argparse.ArgumentParser:
    """The ``lint`` argument parser (exposed so the main CLI can reuse it as a subparser template)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Static checks of training scripts for gradient-accumulation bugs. "
        "Scripts are parsed, never imported or run. Suppress a finding with "
        "`# accumguard: ignore[CODE]` on its line.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="Python files or directories")
    _add_common(p)
    return p


def build_check_config_parser(prog: str = "accumguard check-config") -> argparse.ArgumentParser:
    """The ``check-config`` argument parser."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Check DeepSpeed config files (read with hjson, exactly as DeepSpeed reads them) "
        "for accumulation mistakes.",
    )
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="DeepSpeed JSON config file(s)")
    p.add_argument("--world-size", type=int, metavar="W", help="data-parallel ranks, for the batch arithmetic")
    p.add_argument(
        "--accumulation-steps",
        type=int,
        metavar="K",
        help="micro-batches per optimizer step in your training loop (compared with the config)",
    )
    p.add_argument(
        "--coalesced",
        action="store_true",
        help="the loop wraps the K backwards in engine.coalesce_grad_reduction() (config GA must be 1)",
    )
    _add_common(p)
    return p


def _emit(text: str, output: str | None) -> None:
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


def _parse(parser: argparse.ArgumentParser,
           argv: list[str] | None) -> tuple[argparse.Namespace, list[str], list[str]] | int:
    """Parse ``argv`` and its --select/--ignore codes, or return the exit code argparse chose
    (2 on a usage error or unknown code, 0 on --help) instead of exiting the process."""
    try:
        args = parser.parse_args(argv)
        select, ignore = _codes(args.select), _codes(args.ignore)
        _check_codes(parser, select + ignore)
    except SystemExit as exc:
        return int(exc.code or 0)
    return args, select, ignore


def lint_main(argv: list[str] | None = None) -> int:
    """Run ``accumguard lint``; return the exit code (0 clean, 1 findings, 2 usage/parse error).

    ``--select``/``--ignore`` choose the rules that run (not a filter applied afterwards).
    Any file that cannot be analysed is reported as ``path:line:col: message`` on stderr
    and makes the exit code 2; the other files are still checked.
    """
    from accumguard.core.errors import LintError
    from accumguard.static.lint import lint_paths

    parser = build_lint_parser()
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    args, select, ignore = parsed
    try:
        findings, errors = lint_paths(args.paths, select=select or None, ignore=ignore or None)
    except (LintError, OSError, MemoryError, RecursionError) as exc:  # last line of defence
        print(f"{parser.prog}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    for err in errors:
        print(f"{err.path}:{err.line}:{err.col}: {err.message}", file=sys.stderr)
    _emit(render(findings, args.format, tool="accumguard lint"), args.output)
    if errors:
        return EXIT_ERROR
    return EXIT_FINDINGS if findings else EXIT_CLEAN


def check_config_main(argv: list[str] | None = None) -> int:
    """Run ``accumguard check-config``; return the exit code (0 clean, 1 findings, 2 usage/parse error).

    Configs are read exactly as DeepSpeed reads them (hjson, duplicate keys refused);
    a config DeepSpeed could not read, a missing file, a file nested too deeply or too
    large are reported on stderr with their position and exit code 2.
    """
    from accumguard.core.errors import ConfigError, LintError
    from accumguard.static.dsconfig import check_config, load_config

    parser = build_check_config_parser()
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    args, select, ignore = parsed
    for name in ("world_size", "accumulation_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"{parser.prog}: error: --{name.replace('_', '-')} must be >= 1, got {value}", file=sys.stderr)
            return EXIT_ERROR
    findings = []
    failed = False
    for path in args.configs:
        try:
            cfg = load_config(path)
        except LintError as exc:
            print(f"{exc.path}:{exc.line}:{exc.col}: {exc.message}", file=sys.stderr)
            failed = True
            continue
        except ConfigError as exc:
            print(f"{path}:1:1: {exc}", file=sys.stderr)
            failed = True
            continue
        findings.extend(
            check_config(
                cfg,
                world_size=args.world_size,
                accumulation_steps=args.accumulation_steps,
                coalesced=args.coalesced,
            )
        )
    findings = filter_findings(findings, select=select or None, ignore=ignore or None)
    _emit(render(findings, args.format, tool="accumguard check-config"), args.output)
    if failed:
        return EXIT_ERROR
    return EXIT_FINDINGS if findings else EXIT_CLEAN
