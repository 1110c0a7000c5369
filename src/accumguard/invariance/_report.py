"""``accumguard invariance``: the report (verdict, JSON) and the findings of ``accumguard
watch`` attached to a run that diverged. Steps are numbered from 1 everywhere."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accumguard.invariance._compare import KComparison, compare_runs
from accumguard.invariance._records import RunRecord
from accumguard.invariance._tolerance import InvarianceTolerance, derive_tolerance

__all__ = ["InvarianceReport", "build_report", "watch_findings", "JSON_VERSION"]

JSON_VERSION = 1


@dataclass
class InvarianceReport:
    """Everything one ``accumguard invariance`` call found."""

    command: list[str]
    ks: tuple[int, ...]
    batch: int | None
    steps: int
    tolerance: float
    tolerance_reason: str
    runs: list[RunRecord]
    comparisons: list[KComparison]
    no_dropout: bool = False
    warnings: list[str] = field(default_factory=list)
    # findings of the observation layer (watch) for each run that diverged, by K
    findings: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    findings_text: dict[int, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def diverged(self) -> bool:
        return any(c.diverged for c in self.comparisons)

    @property
    def first_divergent_step(self) -> int | None:
        steps = [c.first_divergent_step for c in self.comparisons if c.diverged]
        return min(steps) if steps else None  # type: ignore[type-var]

    @property
    def by_construction(self) -> bool:
        """Some K differs, in a script that is not K-invariant by construction."""
        return any(c.by_construction for c in self.comparisons)

    @property
    def exit_code(self) -> int:
        """1 when a K diverged, or when a run that is not K-invariant by construction has an
        error-level watch finding (its accumulation is then judged by those checks)."""
        errors = any(f.get("severity") == "error" for c in self.comparisons
                     if c.by_construction for f in self.findings.get(c.k, []))
        return 1 if self.diverged or errors else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION, "tool": "accumguard invariance",
            "command": self.command, "ks": list(self.ks), "k_ref": self.ks[0],
            "batch": self.batch, "steps": self.steps, "no_dropout": self.no_dropout,
            "step_numbering": "1-based: step 1 is the first optimizer step",
            "tolerance": self.tolerance, "tolerance_reason": self.tolerance_reason,
            "diverged": self.diverged, "first_divergent_step": self.first_divergent_step,
            "not_invariant_by_construction": self.by_construction,
            "exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3),
            "warnings": self.warnings,
            "runs": [r.summary() for r in self.runs],
            "comparisons": [c.to_dict() for c in self.comparisons],
            "findings": {str(k): v for k, v in self.findings.items()},
        }

    def write_json(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n",
                        encoding="utf-8")
        return path


def build_report(runs: list[RunRecord], *, command: Sequence[str], batch: int | None,
                 steps: int, tolerance: float | None = None, no_dropout: bool = False,
                 warnings_: Sequence[str] = ()) -> InvarianceReport:
    """Compare every run with the first; the tolerance defaults to the one derived from the
    recorded dtypes and K (:func:`._tolerance.derive_tolerance`)."""
    ks = tuple(r.k for r in runs)
    dtypes = [r.param_dtype for r in runs if r.param_dtype]
    dtype = _least_precise(dtypes)
    bound: float | InvarianceTolerance
    if tolerance is None:
        bound = derive_tolerance(runs)
        tol, reason = bound.base, bound.reason
    else:
        bound = tol = tolerance
        reason = f"--tolerance {tolerance:g} (parameters: {dtype or 'unknown'})"
    ref = runs[0]
    comps = [compare_runs(ref, r, bound) for r in runs[1:]]
    return InvarianceReport(command=list(command), ks=ks, batch=batch, steps=steps,
                            tolerance=tol, tolerance_reason=reason, runs=runs,
                            comparisons=comps, no_dropout=no_dropout, warnings=list(warnings_))


def _least_precise(dtypes: Sequence[str]) -> str | None:
    for name in ("bfloat16", "float16", "float32", "float64"):
        if name in dtypes:
            return name
    return dtypes[0] if dtypes else None



def watch_findings(run: RunRecord) -> tuple[list[dict[str, Any]], str]:
    """What ``accumguard watch`` finds in one run's recording (K known: the run's own).

    Returns the findings as dicts (the observation layer's fields; ``step`` and
    ``micro`` are 1-based like the rest of this report, ``optimizer_step`` repeats
    ``step`` for readers of the first JSON version) and one text line each.
    """
    from accumguard.observe.rules import watch_dict
    from accumguard.watch._findings import analyze, load_recordings

    rec = load_recordings(run.observe_dir)
    found, _k, _source = analyze(rec, k_flag=run.k)
    out: list[dict[str, Any]] = []
    lines: list[str] = [
        f"accumguard FAILED while judging this run's recording (its own error): the rule "
        f"{f.get('rule')} raised {f.get('error')}; what it checks was not judged"
        for f in rec.judge_failures]
    for f in found:
        d = watch_dict(f)
        step = d.get("step")
        d["optimizer_step"] = step if isinstance(step, int) else None
        out.append(d)
        where = ", ".join(x for x in (
            f"rank {d['rank']}" if d.get("rank") is not None else "",
            f"step {d['optimizer_step']}" if d["optimizer_step"] is not None else "",
            f"micro-step {d['micro']}" if d.get("micro") is not None else "") if x)
        lines.append(f"{d.get('severity', '?')} {d.get('cls', '?')} ({d.get('title', '')})"
                     f"{' at ' + where if where else ''}: {d.get('evidence', '')}")
        if d.get("fix") and d.get("severity") == "error":
            lines.append(f"  fix: {d['fix']}")
    return out, "\n".join(lines)


