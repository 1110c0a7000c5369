"""Entry points of the script linter: parse one file (never import or run it), build its
:class:`~accumguard.static.lint._context.FileContext`, run the selected rules, apply the
``# accumguard: ignore[...]`` comments.

Cost stays linear in the file size: one parse, one walk, answers cached per node or
scope (a 5 MB script is linted in a few seconds). Anything that cannot be analysed
raises :class:`~accumguard.core.errors.LintError` with a position, never another
exception.
"""

from __future__ import annotations

import ast
import gc
import io
import re
import tokenize
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from accumguard.core.errors import LintError
from accumguard.static.findings import Finding
from accumguard.static.lint._context import FileContext
from accumguard.static.lint.registry import run_checks

__all__ = ["LintError", "RuleFailure", "iter_python_files", "lint_file", "lint_paths", "lint_source"]

_SUPPRESS_RE = re.compile(r"#\s*accumguard:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?", re.IGNORECASE)
#: every rule needs one of these words in the text; other files are only parsed
_RELEVANT_TEXT = re.compile(r"backward|all_reduce|gradient_sync|grad_sync|train_batch_size|"
                            r"train_micro_batch|gradient_accumulation_steps|zero_optimization|compute_loss|"
                            r"on_substep_end|accumulate_grad_batches|GradientAccumulationScheduler|"
                            r"autograd\.grad\b|TrainingArguments|accum|Trainer\b|training_step|strategy\.reduce")
#: above this many bytes a file is refused (generated data, not a training script; the
#: syntax tree of a 16 MB script alone takes about 2 GB)
MAX_BYTES = 16 * 1024 * 1024


def _suppressions(source: str) -> dict[int, set[str] | None]:
    """Line -> codes suppressed there (``None`` = all), from ``# accumguard: ignore[...]`` comments."""
    out: dict[int, set[str] | None] = {}
    if not _SUPPRESS_RE.search(source):
        return out  # the common case: no tokenizing at all
    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        comments = [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        comments = [(i, line) for i, line in enumerate(source.splitlines(), 1) if "#" in line]
    for line, text in comments:
        m = _SUPPRESS_RE.search(text)
        if not m:
            continue
        if m.group(1) is None:
            out[line] = None
        else:
            codes = {c.strip().upper() for c in m.group(1).split(",") if c.strip()}
            prev = out.get(line, set())
            out[line] = None if prev is None else prev | codes
    return out


def _decode(data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("latin-1")


def lint_source(
    source: str | bytes,
    path: str | Path | None = None,
    *,
    prefilter: bool = True,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> list[Finding]:
    """Lint one script's source text; return findings (suppressions applied), sorted.

    ``path`` is used for messages and to find a DeepSpeed config named in the
    script (relative to the script's directory). ``select``/``ignore`` (codes or
    prefixes) choose which rules *run*. Raises :class:`LintError` when the source
    is not valid Python or cannot be analysed. Files without any word a rule
    needs (``backward``, ``all_reduce``, a DeepSpeed batch key...) are only parsed
    (``prefilter=False`` analyses them anyway, which the robustness tests use).
    """
    # The tree of a big file is millions of GC-tracked objects without cycles: a cyclic
    # collection triggered by the analysis' allocations would rescan all of them (half
    # the run time of a 5 MB file), so the collector pauses while one file is analysed.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_source(source, path, prefilter=prefilter, select=select, ignore=ignore)
    finally:
        if was_enabled:
            gc.enable()


def _lint_source(
    source: str | bytes,
    path: str | Path | None,
    *,
    prefilter: bool,
    select: Sequence[str] | None,
    ignore: Sequence[str] | None,
) -> list[Finding]:
    shown = str(path) if path is not None else "<string>"
    if len(source) > MAX_BYTES:
        raise LintError(shown, 1, 1, f"file is {len(source) / 1e6:.0f} MB; limit "
                        f"{MAX_BYTES // 2**20} MB (generated data, not a training script?)")
    text = _decode(source) if isinstance(source, bytes) else source
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=shown)
    except SyntaxError as exc:
        line = exc.lineno if exc.lineno and exc.lineno > 0 else 1
        col = exc.offset if exc.offset and exc.offset > 0 else 1
        raise LintError(shown, line, col, f"SyntaxError: {exc.msg}") from None
    except RecursionError:
        raise LintError(shown, 1, 1, "nested too deeply for Python's parser to analyse") from None
    except (ValueError, MemoryError) as exc:
        raise LintError(shown, 1, 1, f"cannot parse: {type(exc).__name__}: {exc}") from None
    if prefilter and not _RELEVANT_TEXT.search(text):
        return []
    failures: list[str] = []
    try:
        ctx = FileContext(tree, Path(path) if path is not None else None)
        findings = run_checks(ctx, select, ignore, failures)
    except RecursionError:
        raise LintError(shown, 1, 1, "nested too deeply to analyse") from None
    if failures:
        raise RuleFailure(shown, "; ".join(failures), _kept(findings, text, shown))
    return _kept(findings, text, shown)


def _kept(findings: list[Finding], text: str, shown: str) -> list[Finding]:
    """The findings not suppressed by a ``# noqa``-style comment, de-duplicated, sorted."""
    if not findings:
        return []
    sup = _suppressions(text)
    kept = []
    for f in findings:
        s = sup.get(f.line or 0, set())
        if s is None or f.code in s:
            continue
        kept.append(f.with_path(shown))
    # de-duplicate (a call can sit in two windows only through odd nesting)
    uniq = {(f.code, f.line, f.col): f for f in kept}
    return sorted(uniq.values(), key=Finding.sort_key)


class RuleFailure(LintError):
    """A rule raised on this file: accumguard's own failure, not the script's. ``findings``:
    what the other rules found (kept; the failed rule's are missing)."""

    def __init__(self, path: str, message: str, findings: list[Finding]) -> None:
        super().__init__(path, 1, 1, message)
        self.findings = findings


def lint_file(
    path: str | Path,
    *,
    prefilter: bool = True,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> list[Finding]:
    """Lint one file. Raises :class:`LintError` for unreadable or invalid files."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_BYTES:
            raise LintError(str(path), 1, 1, f"file is {p.stat().st_size / 1e6:.0f} MB; limit "
                            f"{MAX_BYTES // 2**20} MB (generated data, not a training script?)")
        data = p.read_bytes()
    except OSError as exc:
        raise LintError(str(path), 1, 1, f"cannot read file: {exc.strerror or exc}") from None
    return lint_source(data, path=p, prefilter=prefilter, select=select, ignore=ignore)


def iter_python_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Expand directories to their ``*.py`` files (sorted); pass files through."""
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            yield from sorted(
                f for f in p.rglob("*.py") if not any(part.startswith(".") for part in f.parts)
            )
        else:
            yield p


def lint_paths(
    paths: Iterable[str | Path],
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> tuple[list[Finding], list[LintError]]:
    """Lint files and directories; return all findings and the files that could not be analysed."""
    findings: list[Finding] = []
    errors: list[LintError] = []
    for p in iter_python_files(paths):
        if not p.exists():
            errors.append(LintError(str(p), 1, 1, "no such file or directory"))
            continue
        try:
            findings.extend(lint_file(p, select=select, ignore=ignore))
        except RuleFailure as exc:
            findings.extend(exc.findings)  # the rules that ran
            errors.append(exc)
        except LintError as exc:
            errors.append(exc)
    return findings, errors
