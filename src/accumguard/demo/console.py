"""What ``accumguard demo`` prints: progress, the verdict table, the story and the summary.

Rich on a terminal, plain text elsewhere (CI logs, tests). The summary that ends
the output is built from :mod:`accumguard.core.taxonomy` (titles and fixes are
worded there, never here): per failure class seen, three lines a person
remembers: what was wrong, by how much, the one-line fix.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

from accumguard.core.taxonomy import fix_for, title

if TYPE_CHECKING:  # pragma: no cover - types only
    from rich.console import Console

    from accumguard.demo.records import DemoRow
    from accumguard.demo.story import StoryResult

__all__ = ["Output", "fmt_err", "summary_lines", "story_lines"]


class Output:
    """Progress and table, with rich on a terminal and plain text elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.rich: Console | None = None
        if getattr(stream, "isatty", lambda: False)():
            try:
                from rich.console import Console

                self.rich = Console(file=stream)
            except ImportError:  # plain text fallback
                self.rich = None

    def line(self, text: str = "") -> None:
        if self.rich is not None:
            self.rich.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    @contextlib.contextmanager
    def progress(self, total: int) -> Iterator[Callable[[str, int], None]]:
        """Yields ``advance(label, steps)``; a rich bar, or one line per finished label."""
        if self.rich is not None:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.completed}/{task.total} steps"),
                          TimeElapsedColumn(), console=self.rich, transient=False) as bar:
                task = bar.add_task("starting ranks", total=total)

                def advance(label: str, n: int) -> None:
                    bar.update(task, advance=n, description=label)

                yield advance
            return
        done = [0]

        def advance_plain(label: str, n: int) -> None:
            done[0] += n
            print(f"  [{done[0]:>3}/{total} steps] {label}", file=self.stream, flush=True)

        yield advance_plain

    def table(self, rows: list[DemoRow]) -> None:
        headers = ["engine", "loop", "expected", "verdict", "rel. update err", "diagnosis",
                   "opt steps", "coll/step", "ok"]
        cells = [[r.engine, r.loop, r.expected, r.verdict, fmt_err(r.max_update_error),
                  r.diagnosis or ("-" if r.verdict == "PASS" else (r.note or "-")),
                  "-" if r.optimizer_steps is None else f"{r.optimizer_steps}/{r.reference_steps}",
                  "-" if r.collectives_per_step is None else f"{r.collectives_per_step:g}",
                  {True: "yes", False: "NO", None: "-"}[r.as_expected]] for r in rows]
        self.grid("accumguard demo: loops vs the single-process large batch", headers, cells,
                  [r.as_expected for r in rows])

    def grid(self, heading: str, headers: list[str], cells: list[list[str]],
             oks: list[bool | None]) -> None:
        """A table; rows whose ``ok`` is False stand out (bold red / marked)."""
        if self.rich is not None:
            from rich.table import Table

            t = Table(title=heading)
            for h in headers:
                t.add_column(h, overflow="fold")
            for c, ok in zip(cells, oks, strict=True):
                t.add_row(*c, style={True: None, False: "bold red", None: "dim"}[ok])
            self.rich.print(t)
            return
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        self.line(heading)
        self.line(fmt.format(*headers).rstrip())
        self.line("  ".join("-" * w for w in widths))
        for c in cells:
            self.line(fmt.format(*c).rstrip())


def fmt_err(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.1e}"


# ----------------------------------------------------------------------------- the story
def story_lines(story: StoryResult) -> tuple[str, list[list[str]], list[bool | None]]:
    """The story's heading, table cells and ok flags (final eval loss per run)."""
    heading = (f"story: {story.steps} optimizer steps of {story.samples_per_step} sequences "
               f"(micro-batch {story.micro_batch_rows}, K={story.accumulation_steps}, "
               f"W={story.world_size}), same LR {story.lr:g}; eval loss on "
               f"{story.eval_sequences} held-out sequences")
    cells = []
    for s in story.series:
        final = f"{s.eval_loss[-1]:.4f}" if s.eval_loss else "-"
        if s.key == "large-batch":
            gap = "(reference)"
        elif s.final_gap is None:
            gap = "-"
        else:
            gap = f"{s.final_gap:+.2f}" if abs(s.final_gap) >= 0.01 else f"{s.final_gap:+.1e}"
        expect = {"reference": "-", "match": "same", "worse": "worse"}[s.expected]
        ok = {True: "yes", False: "NO", None: "-"}[s.as_expected]
        cells.append([s.label, str(s.optimizer_steps) if s.eval_loss else "-", final, gap,
                      expect, ok + (f" ({s.note})" if s.note else "")])
    return heading, cells, [s.as_expected for s in story.series]


STORY_HEADERS = ["run", "steps", "final eval loss", "vs large batch", "expected", "ok"]


# ----------------------------------------------------------------------------- the summary
def summary_lines(rows: list[DemoRow], story: StoryResult | None = None) -> list[str]:
    """Three lines per failure class the demo's broken loops showed: what was wrong (with
    the loops it was seen in), by how much, and the fix, worded by the taxonomy."""
    groups: dict[str, list[DemoRow]] = {}
    for r in rows:
        if r.kind == "broken" and r.verdict == "FAIL":
            groups.setdefault(r.diagnosis or r.expected, []).append(r)
    out: list[str] = []
    for class_id, group in groups.items():
        where = ", ".join(r.engine for r in group)
        out.append(f"{class_id} ({where}): {title(class_id)}: {group[0].description}")
        out.append(f"    by how much: {_how_much(group, story, class_id)}")
        out.append(f"    fix: {fix_for(class_id) or 'see the diagnosis above'}")
    return out


def _how_much(group: list[DemoRow], story: StoryResult | None, class_id: str) -> str:
    errs = [r.max_update_error for r in group if r.max_update_error is not None]
    parts = []
    if errs:
        worst = max(errs)
        parts.append(f"the update is {worst:.0%} off the large batch's "
                     f"(relative error {worst:.1e}; a correct loop: < 1e-5)")
    steps = [(r.optimizer_steps, r.reference_steps) for r in group
             if r.optimizer_steps is not None and r.optimizer_steps != r.reference_steps]
    if steps:
        got, want = steps[0]
        parts.append(f"{got} optimizer steps instead of {want}")
    bad = story.get("deepspeed-z2/bug-F2") if story is not None else None
    if class_id == "F2" and bad is not None and bad.final_gap is not None:
        ref = story.get("large-batch") if story is not None else None
        ref_final = f" ({bad.eval_loss[-1]:.2f} vs {ref.eval_loss[-1]:.2f})" if ref else ""
        parts.append(f"after {bad.optimizer_steps} steps the eval loss is "
                     f"{bad.final_gap:+.2f} higher{ref_final}")
    return "; ".join(parts) if parts else "see the table"
