"""Render findings as text (ruff style), JSON, or SARIF 2.1.0.

Text is for people and for editor/CI problem matchers: the first line of each
finding is exactly ``path:line:col: CODE message``; an indented ``help:`` line
follows unless ``concise`` is set. JSON is one object, ``{"schema_version": 1,
"tool", "tool_version", "findings": [...]}`` (the same version key as the audit's
JSON; schema in tests/static/lint_output.schema.json). SARIF 2.1.0 is what GitHub
code scanning and most IDEs ingest. Versions come from the installed package.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accumguard.static.findings import RULES, Confidence, Finding, Severity

__all__ = ["FINGERPRINT_KEY", "FORMATS", "JSON_SCHEMA_VERSION", "fingerprints", "render", "tool_version"]

FORMATS = ("text", "concise", "json", "sarif")
JSON_SCHEMA_VERSION = 1


def tool_version() -> str:
    """The installed accumguard version (``0+unknown`` from a source tree that is not installed)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("accumguard")
    except (ImportError, PackageNotFoundError):
        return "0+unknown"

#: SARIF 2.1.0's ``level`` of each severity (SARIF's own word for a note is "note")
_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}
#: the lint JSON's word for each severity: schema version 1 (and docs/rules.md) call the
#: note "info"
_JSON_SEVERITY = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "info"}


def _loc(f: Finding) -> str:
    return f"{f.path or '<config>'}:{f.line or 1}:{f.col or 1}"


def render_text(findings: Sequence[Finding], *, concise: bool = False) -> str:
    """One ``path:line:col: CODE message`` line per finding (+ ``help:`` unless concise) and a summary."""
    lines: list[str] = []
    for f in findings:
        key = f" [{f.key}]" if f.key and f.line is None else ""
        lines.append(f"{_loc(f)}: {f.code} {f.evidence}{key}")
        if not concise:
            cls = f" [{f.cls}: {f.class_title}]" if f.cls else ""
            lines.append(f"  help: {f.fix}{cls}")
    if findings:
        n_err = sum(f.severity is Severity.ERROR for f in findings)
        lines.append(
            f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''} ({n_err} error"
            f"{'s' if n_err != 1 else ''})."
        )
    return "\n".join(lines) + ("\n" if lines else "")


def _as_dict(f: Finding) -> dict[str, Any]:
    """A finding as the lint JSON (schema version 1) writes it."""
    rule = RULES.get(f.code or "")
    return {
        "code": f.code,
        "name": rule.name if rule else None,
        "failure_class": f.cls or None,
        "failure_class_title": f.class_title or None,
        "severity": _JSON_SEVERITY[f.severity],
        "confidence": (f.confidence or Confidence.HIGH).value,
        "message": f.evidence,
        "fix": f.fix,
        "path": f.path,
        "line": f.line,
        "column": f.col,
        "end_line": f.end_line,
        "end_column": f.end_col,
        "key": f.key,
    }


def render_json(findings: Sequence[Finding], *, tool: str = "accumguard lint") -> str:
    """One JSON object: schema version, tool, tool version and the findings (stable field
    names; ``null`` where unknown)."""
    doc = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": tool,
        "tool_version": tool_version(),
        "findings": [_as_dict(f) for f in findings],
    }
    return json.dumps(doc, indent=2) + "\n"


#: the ``partialFingerprints`` key: bump the version if what is hashed ever changes
FINGERPRINT_KEY = "accumguardFinding/v1"


def fingerprints(findings: Sequence[Finding]) -> list[str]:
    """One fingerprint per finding that survives edits elsewhere in the file: the rule,
    the file, the config key and the *text* of the flagged line (whitespace-trimmed, not
    its number), plus the occurrence of that same text among the findings, so that code
    scanning (GitHub's alert tracking) keeps one alert when lines move above it and opens a
    new one only when the flagged line itself changes."""
    lines: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    out = []
    for f in findings:
        text = ""
        if f.path and f.line:
            if f.path not in lines:
                try:
                    lines[f.path] = Path(f.path).read_text(encoding="utf-8",
                                                           errors="replace").splitlines()
                except OSError:
                    lines[f.path] = []
            src = lines[f.path]
            text = " ".join(src[f.line - 1].split()) if 0 < f.line <= len(src) else ""
        base = "\0".join((f.code or "", (f.path or "").replace("\\", "/"), f.key or "", text))
        digest = hashlib.sha256(base.encode("utf-8")).hexdigest()[:32]
        seen[digest] = seen.get(digest, 0) + 1
        out.append(f"{digest}:{seen[digest]}")
    return out


def render_sarif(findings: Sequence[Finding], *, version: str | None = None) -> str:
    """A SARIF 2.1.0 log with one run; every rule used is described in the driver."""
    used = sorted({f.code for f in findings if f.code})
    rules = []
    for code in used:
        r = RULES.get(code)
        if r is None:
            continue
        rules.append(
            {
                "id": r.code,
                "name": r.name,
                "shortDescription": {"text": r.summary},
                "fullDescription": {"text": r.summary},
                "help": {"text": f"Fix: {r.fix}"},
                "helpUri": f"https://github.com/accumguard/accumguard/blob/main/docs/rules.md#{r.code.lower()}",
                "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
                "properties": {
                    "failureClass": r.failure_class,
                    "failureClassTitle": r.class_title,
                    "confidence": r.confidence.value,
                },
            }
        )
    index = {r["id"]: i for i, r in enumerate(rules)}
    results = []
    prints = fingerprints(findings)
    for f, fp in zip(findings, prints, strict=True):
        region: dict[str, Any] = {"startLine": f.line or 1, "startColumn": f.col or 1}
        if f.end_line:
            region["endLine"] = f.end_line
        if f.end_col:
            region["endColumn"] = f.end_col
        result: dict[str, Any] = {
            "ruleId": f.code,
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f"{f.evidence}. Fix: {f.fix}"},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": (f.path or "").replace("\\", "/")},
                        "region": region,
                    }
                }
            ],
        }
        result["partialFingerprints"] = {FINGERPRINT_KEY: fp}
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        if f.key:
            result["properties"] = {"configKey": f.key}
        results.append(result)
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "accumguard",
                        "version": version or tool_version(),
                        "informationUri": "https://github.com/accumguard/accumguard",
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"


def render(findings: Sequence[Finding], fmt: str, *, tool: str = "accumguard lint") -> str:
    """Dispatch on ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "json":
        return render_json(findings, tool=tool)
    if fmt == "sarif":
        return render_sarif(findings)
    if fmt in ("text", "concise"):
        return render_text(findings, concise=fmt == "concise")
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
