"""JSON and SARIF outputs of lint/check-config validated against schemas (issue 9).

``lint_output.schema.json`` is the JSON output's schema (ours); the SARIF schema is
the part of SARIF 2.1.0 we emit, with the properties the OASIS spec requires. The
validator below implements the JSON-Schema keywords those two files use, so the
test needs no extra dependency; a test makes sure it rejects broken documents.
"""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from accumguard.cli.lint import check_config_main, lint_main

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "lint_corpus"
JSON_SCHEMA = json.loads((HERE / "lint_output.schema.json").read_text())
SARIF_SCHEMA = json.loads((HERE / "sarif_2_1_0_subset.schema.json").read_text())

_TYPES = {
    "object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
    "boolean": bool, "null": type(None),
}


def errors(doc: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Violations of ``schema`` in ``doc`` (type, const, enum, pattern, minLength, minimum,
    required, properties, additionalProperties, items, minItems)."""
    out: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(
            isinstance(doc, _TYPES[t]) and not (t in ("integer", "number") and isinstance(doc, bool))
            for t in types
        )
        if not ok:
            return [f"{where}: {type(doc).__name__} is not {types}"]
    if "const" in schema and doc != schema["const"]:
        out.append(f"{where}: {doc!r} != {schema['const']!r}")
    if "enum" in schema and doc not in schema["enum"]:
        out.append(f"{where}: {doc!r} not in {schema['enum']}")
    if isinstance(doc, str):
        if "pattern" in schema and not re.search(schema["pattern"], doc):
            out.append(f"{where}: {doc!r} does not match {schema['pattern']}")
        if len(doc) < schema.get("minLength", 0):
            out.append(f"{where}: too short")
    if isinstance(doc, int) and not isinstance(doc, bool) and doc < schema.get("minimum", doc):
        out.append(f"{where}: {doc} < {schema['minimum']}")
    if isinstance(doc, dict):
        out += [f"{where}: missing {k!r}" for k in schema.get("required", []) if k not in doc]
        props = schema.get("properties", {})
        for k, v in doc.items():
            if k in props:
                out += errors(v, props[k], f"{where}.{k}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{where}: unexpected {k!r}")
    if isinstance(doc, list):
        if len(doc) < schema.get("minItems", 0):
            out.append(f"{where}: fewer than {schema['minItems']} items")
        for i, item in enumerate(doc):
            out += errors(item, schema.get("items", {}), f"{where}[{i}]")
    return out


def run(main: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    code = main(args)
    assert code == 1  # every input here has findings (the corpus, a broken config, a buggy script)
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def configs(tmp_path: Path) -> list[str]:
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  train_batch_size: 30\n  train_micro_batch_size_per_gpu: 4\n  gradient_accumulation_steps: 4\n"
                   "  bf16: {enabled: true}\n  zero_optimization: {stage: 2}\n  gradient_accumulation_step: 3\n}\n")
    return [str(bad), str(CORPUS / "ds_config_ga1.json")]


def test_lint_json_matches_schema(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run(lint_main, [str(CORPUS), "--format", "json"], capsys)
    assert errors(doc, JSON_SCHEMA) == []
    assert doc["tool_version"] == version("accumguard")
    codes = {f["code"] for f in doc["findings"]}
    assert {f"AG1{n:02d}" for n in range(1, 17)} <= codes  # every script rule shows up
    assert all(f["failure_class_title"] for f in doc["findings"] if f["failure_class"])


def test_check_config_json_matches_schema(configs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    doc = run(check_config_main, [*configs, "--format", "json", "--accumulation-steps", "4"], capsys)
    assert errors(doc, JSON_SCHEMA) == []
    assert doc["tool"] == "accumguard check-config"
    assert {"AG201", "AG202", "AG204", "AG205", "AG206"} <= {f["code"] for f in doc["findings"]}


@pytest.mark.parametrize("which", ["lint", "check-config"])
def test_sarif_matches_the_2_1_0_structure(which: str, configs: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    if which == "lint":
        log = run(lint_main, [str(CORPUS), "--format", "sarif"], capsys)
    else:
        log = run(check_config_main, [*configs, "--format", "sarif"], capsys)
    assert errors(log, SARIF_SCHEMA) == []
    run_ = log["runs"][0]
    driver = run_["tool"]["driver"]
    assert driver["version"] == version("accumguard")  # not hard-coded
    ids = [r["id"] for r in driver["rules"]]
    assert len(ids) == len(set(ids))
    for res in run_["results"]:  # ruleIndex points at the rule it names
        assert ids[res["ruleIndex"]] == res["ruleId"]


def test_the_validator_rejects_broken_documents(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run(lint_main, [str(CORPUS / "bug_plain_zero_grad_top.py"), "--format", "json"], capsys)
    broken = json.loads(json.dumps(doc))
    broken["findings"][0]["line"] = 0
    del broken["findings"][0]["fix"]
    broken["extra"] = True
    problems = errors(broken, JSON_SCHEMA)
    assert any("line" in p for p in problems) and any("'fix'" in p for p in problems)
    assert any("unexpected 'extra'" in p for p in problems)
    log = run(lint_main, [str(CORPUS / "bug_plain_zero_grad_top.py"), "--format", "sarif"], capsys)
    log["runs"][0]["results"][0]["level"] = "fatal"
    del log["runs"][0]["tool"]["driver"]["name"]
    assert len(errors(log, SARIF_SCHEMA)) == 2


def _prints(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[str, int]]:
    log = run(lint_main, [str(path), "--format", "sarif"], capsys)
    return {r["partialFingerprints"]["accumguardFinding/v1"]:
            (r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
            for r in log["runs"][0]["results"]}


def test_sarif_fingerprints_survive_moved_lines_and_change_with_the_flagged_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Code scanning tracks an alert by its fingerprint: lines added above a finding must
    keep it (same alert, new line number); editing the flagged line makes a new one."""
    src = (CORPUS / "bug_plain_zero_grad_top.py").read_text()
    script = tmp_path / "train.py"
    script.write_text(src)
    before = _prints(script, capsys)
    assert before and all(re.fullmatch(r"[0-9a-f]{32}:\d+", fp) for fp in before)
    script.write_text("import os\n\n\n" + src)  # three lines above everything
    after = _prints(script, capsys)
    assert set(after) == set(before)
    assert all(after[fp][1] == before[fp][1] + 3 for fp in before)
    line = min(ln for _, ln in before.values())
    edited = src.splitlines()
    edited[line - 1] = edited[line - 1] + "  # edited"
    script.write_text("\n".join(edited) + "\n")
    changed = _prints(script, capsys)
    assert len(changed) == len(before) and set(changed) != set(before)


def test_sarif_fingerprints_tell_identical_lines_apart() -> None:
    from accumguard.static.findings import lint_finding
    from accumguard.static.lint.report import fingerprints

    same = [lint_finding("AG101", "m", fix="f", line=None, path=None)] * 2
    a, b = fingerprints(same)
    assert a.split(":")[0] == b.split(":")[0] and a != b
