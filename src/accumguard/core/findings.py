"""The one record every check of accumguard reports: :class:`Finding`, with one :class:`Severity`.

``watch`` and ``invariance`` (the per-window rules of :mod:`accumguard.observe.rules`), the
framework callbacks (:mod:`accumguard.integrations`), the runtime guard and ``lint`` /
``check-config`` (:mod:`accumguard.static`) all build this type, so a finding means the same
thing wherever it comes from: a failure class of :mod:`.taxonomy`, how sure we are that the
update is wrong, where (rank, optimizer step, micro-step; file, line, column, config key for a
static check), what was measured or read, and the fix.

Each product keeps its own documented output (``watch --json`` schema version 1, the lint JSON
and SARIF, the callbacks' records and log lines); those are functions next to the product that
writes them, over this one type, not subclasses of it.

Pure Python: the static checks import it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from accumguard.core.taxonomy import TAXONOMY

__all__ = ["Confidence", "Finding", "Severity"]


class Severity(str, Enum):
    """How sure we are that the optimizer's update differs from the large batch's.

    ``error``: the evidence proves it (a measured or certain difference; exit code 1).
    ``warning``: wrong under a condition the check cannot see, or a risk that grows (e.g.
    bf16 accumulation); worth reading, not proven.
    ``note``: correct but costly, or worth a conscious choice; never a failure.

    ``lint`` and ``check-config`` call a note "info" in their JSON (schema version 1) and
    in docs/rules.md; ``Severity("info")`` and ``Severity.INFO`` are the note. SARIF calls
    it ``"note"`` too.
    """

    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"
    INFO = "note"  # an alias: lint's old name of the note level

    @classmethod
    def _missing_(cls, value: object) -> Severity | None:
        return cls.NOTE if value == "info" else None

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Confidence(str, Enum):
    """How often the heuristic behind a static rule is right on real scripts (documented in
    docs/rules.md); run-time findings carry none (they are measured)."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Finding:
    """One problem (or note) found by any check of accumguard.

    The first eight fields are positional (the order ``watch`` has always written them);
    ``step`` and ``micro`` count from 1 (optimizer step 1 is the first, micro-step 1 the
    first backward of its window), ``rank`` is ``None`` for a finding about every rank (or
    the comparison of ranks). ``title`` is the class's title unless the check words its own
    (e.g. a measured cost). The keyword-only fields locate a static finding: the rule
    ``code`` (``"AG101"``), the file ``path``, 1-based ``line``/``col`` (``None`` when
    unknown, e.g. a *missing* config key) and their ``end_*``, the dotted config ``key``
    (``"zero_optimization.stage"``) and the rule's ``confidence``.

    ``cls`` is ``""`` for a static rule with no failure class (a correct but wasteful
    pattern). ``severity`` may be given as its string; it is stored as :class:`Severity`.
    """

    cls: str
    severity: Severity
    rank: int | None
    step: int | None
    micro: int | None
    evidence: str
    fix: str
    title: str
    code: str | None = field(default=None, kw_only=True)
    path: str | None = field(default=None, kw_only=True)
    line: int | None = field(default=None, kw_only=True)
    col: int | None = field(default=None, kw_only=True)
    end_line: int | None = field(default=None, kw_only=True)
    end_col: int | None = field(default=None, kw_only=True)
    key: str | None = field(default=None, kw_only=True)
    confidence: Confidence | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        # a check written with the plain words ("error", "note", lint's "info") gets the enum
        if not isinstance(self.severity, Severity):
            object.__setattr__(self, "severity", Severity(self.severity))
        if self.confidence is not None and not isinstance(self.confidence, Confidence):
            object.__setattr__(self, "confidence", Confidence(self.confidence))

    # -- the names the three former records used -----------------------------------------
    @property
    def class_id(self) -> str:
        """The failure class (the framework callbacks' name for :attr:`cls`)."""
        return self.cls

    @property
    def failure_class(self) -> str:
        """The failure class (the static checks' name for :attr:`cls`; ``""`` if none)."""
        return self.cls

    @property
    def class_title(self) -> str:
        """The failure class's title from :mod:`.taxonomy` (``""`` without a known class)."""
        return TAXONOMY[self.cls].title if self.cls in TAXONOMY else ""

    @property
    def message(self) -> str:
        """What the static check read (the static checks' name for :attr:`evidence`)."""
        return self.evidence

    # -- helpers ---------------------------------------------------------------------------
    def with_path(self, path: str) -> Finding:
        """A copy attributed to ``path`` (a static check builds its findings before the path
        is known)."""
        return replace(self, path=path)

    def sort_key(self) -> tuple[str, int, int, str]:
        """File, position, then code: the order linters conventionally print."""
        return (self.path or "", self.line or 0, self.col or 0, self.code or "")

    def as_dict(self) -> dict[str, object]:
        """Every field that is set, JSON-ready: the eight common fields (``severity`` as its
        string), ``class_id`` (the same as ``cls``, the name the callbacks' records used),
        then the static location fields that are not ``None``. Each product's documented
        layout is its own function (``watch``: :func:`accumguard.observe.rules.watch_dict`;
        callbacks: :func:`accumguard.integrations._checks.callback_dict`; lint: its JSON)."""
        out: dict[str, object] = {
            "cls": self.cls, "severity": self.severity.value, "rank": self.rank,
            "step": self.step, "micro": self.micro, "evidence": self.evidence, "fix": self.fix,
            "title": self.title, "class_id": self.cls}
        for name in ("code", "path", "line", "col", "end_line", "end_col", "key"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.confidence is not None:
            out["confidence"] = self.confidence.value
        return out

    def __str__(self) -> str:
        """One line: ``path:line:col: CODE message`` for a static finding (lint's text line);
        ``accumguard step S: CLASS title: evidence. Fix: fix`` otherwise (the callbacks' log
        line; ``rank R`` and ``micro-step M`` are added when known)."""
        if self.code is not None:
            return (f"{self.path or '<config>'}:{self.line or 1}:{self.col or 1}: {self.code} "
                    f"{self.evidence}")
        where = " ".join(x for x in (
            "" if self.rank is None else f"rank {self.rank}",
            "" if self.step is None else f"step {self.step}",
            "" if self.micro is None else f"micro-step {self.micro}") if x)
        head = f"accumguard {where}" if where else "accumguard"
        return f"{head}: {self.cls} {self.title}: {self.evidence}. Fix: {self.fix}"
