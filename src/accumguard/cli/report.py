"""Present audit reports: a rich table on the terminal, plain text without rich, JSON.

``rich`` is optional (``pip install 'accumguard[cli]'``) and imported only here,
only when a report is printed; without it the same content is printed as plain
text. The comparison logic lives in :mod:`accumguard.verify.audit`; this module only
formats.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from accumguard.verify.audit import AuditReport, ProgressFn

__all__ = ["format_text", "print_report", "write_json", "progress", "JSON_SCHEMA_VERSION"]

JSON_SCHEMA_VERSION = 2  # 2: epochs, compute_dtype, tolerance_model, per-step grad_tolerance, diagnosis basis

_STEP_COLUMNS = ("step", "update err", "tol", "grad err", "lr", "ref lr", "loss", "bwd",
                 "grad comm", "opt", "sched", "zero_grad")


def _fmt(x: Any, spec: str = ".2e") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    if isinstance(x, (list, tuple)):
        return ",".join(_fmt(v, ".3g") for v in x) if x else "-"
    return str(x)


def _rows(report: AuditReport) -> list[list[str]]:
    rows = []
    for s in report.steps:
        c = s.counts
        rows.append([str(s.step), _fmt(s.update_error), _fmt(s.update_tolerance, ".1e"),
                     _fmt(s.grad_error), _fmt(s.lr),
                     _fmt(s.ref_lr), _fmt(s.loss, ".4f"), str(c.backward),
                     str(c.grad_collective_rounds), str(c.optimizer_steps),
                     str(c.scheduler_steps), str(c.zero_grad)])
    return rows


def _header(report: AuditReport) -> list[str]:
    verdict = "PASS" if report.passed else "FAIL"
    lines = [
        f"{verdict}  {report.name}: engine={report.engine}, world_size={report.world_size}, "
        f"K={report.accumulation_steps}, {report.optimizer_steps} optimizer steps "
        f"(reference {report.reference_steps})"
        + (f", {report.epochs} epochs" if report.epochs > 1 else "")
        + f", params {report.param_dtype}, compute {report.compute_dtype} vs "
        f"{report.reference_dtype} reference",
        f"max relative update error {_fmt(report.max_update_error)}, max gradient error "
        f"{_fmt(report.max_grad_error) if report.gradients_observed else 'not observable'}; "
        f"tolerance {report.tolerance:.3g} ({report.tolerance_reason})",
    ]
    d = report.first_divergence
    if d is not None:
        lines.append(f"first divergence: step {d.step}, parameter {d.parameter!r}, max |abs diff| "
                     f"{d.max_abs_diff:.3g}, relative {d.max_rel_diff:.3g}")
    return lines


def _footer(report: AuditReport) -> list[str]:
    lines = [f"failure: {f}" for f in report.failures]
    dg = report.diagnosis
    if dg is not None:
        lines.append(f"diagnosis: {dg.summary()}")
        if dg.runner_up is not None:
            r = dg.runner_up
            lines.append(f"runner-up: {r.id} ({r.title}), residual {r.residual:.2g}")
        for e in dg.evidence:
            lines.append(f"evidence: {e}")
        lines.append(f"fix: {dg.fix}")
    lines += [f"note: {n}" for n in report.notes]
    return lines


def format_text(report: AuditReport) -> str:
    """The report as plain text (what is printed when rich is not installed)."""
    rows = _rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(_STEP_COLUMNS)]
    out = _header(report)
    out.append("  ".join(h.rjust(w) for h, w in zip(_STEP_COLUMNS, widths, strict=True)))
    for r in rows:
        out.append("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    out += _footer(report)
    return "\n".join(out)


def _rich_console(file: TextIO | None) -> Any:
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=file or sys.stdout, width=max(100, _term_width()))


def _term_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 140


def print_report(report: AuditReport, file: TextIO | None = None) -> None:
    """Print ``report``: a rich table when rich is installed, else :func:`format_text`."""
    console = _rich_console(file)
    if console is None:
        print(format_text(report), file=file or sys.stdout)
        return
    from rich.table import Table

    head = _header(report)
    style = "bold green" if report.passed else "bold red"
    console.print(head[0], style=style, highlight=False)
    for line in head[1:]:
        console.print(line, highlight=False)
    table = Table(show_lines=False, header_style="bold")
    for col in _STEP_COLUMNS:
        table.add_column(col, justify="right")
    tol = report.tolerance
    for s, row in zip(report.steps, _rows(report), strict=True):
        bad = (s.update_error is not None and s.update_error > (s.update_tolerance or tol)) or (
            s.grad_error is not None and s.grad_error > (s.grad_tolerance or tol))
        table.add_row(*row, style="red" if bad else None)
    console.print(table)
    for line in _footer(report):
        kind = line.split(":", 1)[0]
        console.print(line, style={"failure": "red", "diagnosis": "bold yellow",
                                   "fix": "yellow"}.get(kind), highlight=False)


def write_json(reports: AuditReport | dict[str, AuditReport], path: str | os.PathLike[str]) -> None:
    """Write one report, or several by name, with everything (``to_dict()``), to ``path``."""
    if isinstance(reports, AuditReport):
        reports = {reports.name: reports}
    doc = {"schema_version": JSON_SCHEMA_VERSION, "tool": "accumguard audit",
           "reports": {k: v.to_dict() for k, v in reports.items()},
           "passed": all(r.passed for r in reports.values())}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, allow_nan=False)
        fh.write("\n")


@contextlib.contextmanager
def progress(enabled: bool = True, file: TextIO | None = None) -> Iterator[ProgressFn | None]:
    """A progress callback for :func:`accumguard.verify.audit.audit` (``progress=``): a rich bar
    when rich is installed and the output is a terminal, else ``None`` (silent)."""
    stream = file or sys.stderr
    if not enabled or not getattr(stream, "isatty", lambda: False)():
        yield None
        return
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    except ImportError:
        yield None
        return
    from rich.console import Console

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   console=Console(file=stream), transient=True)
    tasks: dict[str, Any] = {}

    def update(name: str, done: int, total: int) -> None:
        if name not in tasks:
            tasks[name] = bar.add_task(f"auditing {name}", total=total)
        bar.update(tasks[name], completed=min(done, total))

    with bar:
        yield update
