"""``accumguard audit MODULE:SETUP MODULE:LOOP``: audit your own training loop from the shell.

Kept thin: argument parsing, loading the two objects, printing. The audit
itself is :func:`accumguard.verify.audit.audit`. Exit codes: 0 the loop is
equivalent to the large batch, 1 it is not (CI should fail), 2 the audit could
not run (bad arguments, import error, a rank crashed or timed out).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["audit_main", "load_object", "build_parser"]

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds (``--timeout 0`` cannot work:
    the ranks would be killed before they start)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"{text} must be a positive number of seconds, e.g. 300 (0 would kill the ranks "
            "before they start)")
    return value


def positive_int(text: str) -> int:
    """argparse type: a positive int (ranks, steps)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer, e.g. 2")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="accumguard audit",
        description="Run your training loop on W ranks and compare every optimizer step with "
                    "the single-process large-batch reference; name the bug if it differs.")
    p.add_argument("setup", metavar="MODULE:SETUP",
                   help="an AuditSetup object, or a zero-argument function returning one; "
                        "MODULE is a dotted module name or a path to a .py file")
    p.add_argument("loop", metavar="MODULE:LOOP",
                   help="your loop, loop(ctx) -> None (a module-level function)")
    p.add_argument("--world-size", type=positive_int, default=2,
                   help="ranks to spawn (default 2)")
    p.add_argument("--steps", type=int, default=None,
                   help="audit only the first N optimizer steps (default: all data)")
    p.add_argument("--json", metavar="FILE", default=None, help="write the full report as JSON")
    p.add_argument("--fp32-reference", action="store_true",
                   help="compute the reference in float32 instead of float64 (faster, looser)")
    p.add_argument("--timeout", type=positive_seconds, default=300.0,
                   help="kill all ranks after S seconds (default 300)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="override the relative-error tolerance (default: from the dtype)")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (default gloo)")
    p.add_argument("--no-diagnosis", action="store_true", help="skip the diagnosis on failure")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def load_object(spec: str) -> Any:
    """Resolve ``"pkg.module:name"`` or ``"path/to/file.py:name"``.

    A file is imported under its stem with its directory put on ``sys.path``, so
    that the spawned ranks can import it too (functions are pickled by module
    name).
    """
    if ":" not in spec:
        raise ValueError(f"{spec!r} has no ':'; expected MODULE:NAME, e.g. "
                         "my_train.py:SETUP or mypkg.train:my_loop")
    module_part, _, attr = spec.rpartition(":")
    if not module_part or not attr:
        raise ValueError(f"{spec!r}: expected MODULE:NAME with both parts non-empty")
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        path = os.path.abspath(module_part)
        if not os.path.isfile(path):
            raise ValueError(f"{module_part!r} is not a file; pass a path to a .py file or a "
                             "dotted module name")
        directory, filename = os.path.split(path)
        name = os.path.splitext(filename)[0]
        if directory not in sys.path:
            sys.path.insert(0, directory)
        existing = sys.modules.get(name)
        if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") \
                != path:
            raise ValueError(f"{module_part!r} would be imported as module {name!r}, but a "
                             f"different module of that name is already loaded "
                             f"({existing.__file__}); rename the file")
        module = importlib.import_module(name)
    else:
        module = importlib.import_module(module_part)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module.__name__!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _resolve_setup(obj: Any) -> Any:
    from accumguard.verify.contract import AuditSetup

    if isinstance(obj, AuditSetup):
        return obj
    if callable(obj):
        made = obj()
        if isinstance(made, AuditSetup):
            return made
        raise ValueError(f"the setup function returned a {type(made).__name__}, expected an "
                         "AuditSetup")
    raise ValueError(f"SETUP is a {type(obj).__name__}; expected an AuditSetup or a "
                     "zero-argument function returning one")


def audit_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``accumguard audit``; returns the exit code (0 pass, 1 fail, 2 error).

    ``argv`` excludes the program name; a leading ``"audit"`` is accepted too.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["audit"]:
        args_list = args_list[1:]
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is 2
        return int(exc.code or 0)
    import torch

    from accumguard.cli.report import print_report, progress, write_json
    from accumguard.core.errors import AccumguardError
    from accumguard.verify.audit import audit

    try:
        setup = _resolve_setup(load_object(args.setup))
        loop = load_object(args.loop)
        if not callable(loop):
            raise ValueError(f"LOOP {args.loop!r} is a {type(loop).__name__}, not a function")
    except (ValueError, ImportError, AccumguardError) as exc:
        print(f"accumguard audit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        with progress(not args.no_progress) as bar:
            report = audit(setup, loop, world_size=args.world_size, backend=args.backend,
                           reference_dtype=torch.float32 if args.fp32_reference
                           else torch.float64,
                           tolerance=args.tolerance, timeout=args.timeout,
                           diagnose=not args.no_diagnosis, steps=args.steps,
                           name=args.loop.rpartition(":")[2], progress=bar)
    except AccumguardError as exc:
        print(f"accumguard audit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print_report(report)
    if args.json:
        try:
            write_json(report, args.json)
        except OSError as exc:
            print(f"accumguard audit: error: cannot write {args.json}: {exc}", file=sys.stderr)
            return EXIT_ERROR
    return EXIT_PASS if report.passed else EXIT_FAIL


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(audit_main())
