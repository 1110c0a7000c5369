"""One finding type in ``src/``: the rules ``watch`` runs, the framework callbacks' checks,
``lint``/``check-config`` and the runtime guard all report
:class:`accumguard.core.findings.Finding` with one :class:`Severity`, and each product's
documented layout (watch JSON, the callbacks' records and log line, lint JSON and SARIF)
is a function over it. In one process (fast): recordings made in-process, no launch."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest
import torch

from accumguard.core.findings import Finding, Severity

SRC = Path(__file__).resolve().parents[2] / "src" / "accumguard"


def test_src_defines_exactly_one_finding_class_and_one_severity() -> None:
    defined: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in ("Finding", "Severity"):
                defined.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert defined == {"Finding": ["core/findings.py"], "Severity": ["core/findings.py"]}


def test_every_old_import_path_is_the_same_class() -> None:
    import accumguard.integrations as integrations
    import accumguard.integrations._checks as checks
    import accumguard.observe._records as records
    import accumguard.observe.rules as rules
    import accumguard.static as static
    import accumguard.static.findings as static_findings
    import accumguard.watch._findings as watch_findings

    for mod in (integrations, checks, records, rules, watch_findings, static, static_findings):
        assert mod.Finding is Finding, mod.__name__
    assert static.Severity is static_findings.Severity is rules.Severity is Severity


def test_one_severity_vocabulary_and_lints_info_is_the_note() -> None:
    assert [s.value for s in Severity] == ["error", "warning", "note"]
    assert Severity("info") is Severity.INFO is Severity.NOTE
    # it behaves as the plain string the watch rules used before: equal, hashed, formatted
    assert Severity.ERROR == "error" and Severity.ERROR in {"error"}
    assert f"[{Severity.WARNING}]" == "[warning]" and Severity.NOTE.upper() == "NOTE"
    made = Finding("F3", "error", 0, 2, 1, "evidence", "fix.", "title")  # type: ignore[arg-type]
    assert made.severity is Severity.ERROR


def test_lint_returns_the_one_finding_and_keeps_its_json_and_sarif_words() -> None:
    from accumguard.static.lint import lint_source
    from accumguard.static.lint.report import render_json, render_sarif

    src = textwrap.dedent("""\
        grad_accum_steps = 4
        for i, batch in enumerate(loader):
            loss = model(batch) / grad_accum_steps
            loss.backward()
            optimizer.step()
        """)
    (f,) = lint_source(src, path="train.py")
    assert type(f) is Finding
    assert (f.code, f.cls, f.failure_class, f.severity) == ("AG101", "F1", "F1", Severity.ERROR)
    assert f.message == f.evidence and f.path == "train.py" and f.line == 5
    assert f.rank is None and f.step is None and f.micro is None
    # a note (AG116: correct but wasteful DDP sync) is "info" in the lint JSON (schema 1),
    # "note" in SARIF
    note = Finding("", Severity.NOTE, None, None, None, "m", "f", "sync-every-micro-step",
                   code="AG116", path="t.py", line=1, col=1)
    assert json.loads(render_json([note]))["findings"][0]["severity"] == "info"
    assert json.loads(render_sarif([note]))["runs"][0]["results"][0]["level"] == "note"


def _train_zero_grad_inside(out: Path) -> None:
    from accumguard.watch._recording import recording

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(out):
        for i in range(8):
            opt.zero_grad()  # F3: only the last micro-batch reaches the step
            x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))
            (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()


def test_watch_rules_return_the_one_finding_written_in_the_documented_layout(
        tmp_path: Path) -> None:
    from accumguard.observe.rules import analyze, load_recordings, watch_dict

    _train_zero_grad_inside(tmp_path)
    found, _k, _source = analyze(load_recordings(tmp_path), k_flag=4)
    f3 = [f for f in found if f.cls == "F3"]
    assert f3 and all(type(f) is Finding for f in found)
    assert f3[0].severity is Severity.ERROR and f3[0].rank == 0 and f3[0].code is None
    d = watch_dict(f3[0])
    assert list(d) == ["cls", "severity", "rank", "step", "micro", "evidence", "fix", "title"]
    assert d["severity"] == "error" and type(d["severity"]) is str


def test_callbacks_checks_return_the_one_finding_with_their_log_line_and_record() -> None:
    from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
    from accumguard.integrations._checks import (
        AccumulationChecks,
        callback_dict,
        classify_window,
    )

    rows = [(3.0, 1 / 6), (9.0, 1 / 18)]  # each micro-batch normalised by its own count / K
    recs = torch.tensor([[n, s * 0.7 * n, 0.7 * n] for n, s in rows], dtype=torch.float64)
    f = classify_window([recs], world_size=1, averages_over_ranks=False,
                        accumulation_steps=2, step=0)
    assert type(f) is Finding and f.cls == f.class_id == "F5"
    assert f.severity is Severity.ERROR and (f.rank, f.step, f.micro) == (None, 1, None)
    assert str(f) == f"accumguard step 1: F5 {f.title}: {f.evidence}. Fix: {f.fix}"
    assert callback_dict(f) == {"step": 1, "class_id": "F5", "title": f.title,
                                "evidence": f.evidence, "fix": f.fix}

    # a live run: the scheduler stepped twice per optimizer step (F4)
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    checks = AccumulationChecks(model, opt, accumulation_steps=2, scheduler=sched,
                                logits_module=model.fc2, every_n_steps=1)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=4)[0]
    try:
        for start in (0, 2):
            window = batches[start:start + 2]
            total = sum(float(count_tokens(b)) for b in window)
            for b in window:
                s, _n = token_loss(model, b)
                (s / total).backward()
            opt.step()
            sched.step()
            sched.step()
            opt.zero_grad()
    finally:
        checks.close()
    assert checks.findings and all(type(x) is Finding for x in checks.findings)
    assert {x.cls for x in checks.findings} == {"F4"}
    assert checks.summary()["findings"] == [callback_dict(x) for x in checks.findings]


@pytest.mark.parametrize("mode", ["raise", "warn"])
def test_the_guards_violation_carries_the_one_finding(mode: str) -> None:
    import warnings

    from accumguard.runtime.guard import StepInsideWindowError, guard

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with guard(model, opt, accumulation_steps=4, mode=mode) as g:
                for _ in range(4):
                    model(torch.randn(3, 4)).sum().backward()
                    opt.step()  # F1: a step after every micro-step
                    opt.zero_grad()
        except StepInsideWindowError as exc:
            assert mode == "raise"
            assert exc.finding is not None and exc.finding == g.violations[0].finding
    first = g.violations[0]
    f = first.finding
    assert type(f) is Finding and f.cls == first.rule == "F1"
    assert f.severity is Severity.ERROR and (f.step, f.micro) == (1, 1)  # window 0, micro 0
    assert f.title == StepInsideWindowError.title
    assert f"saw {f.evidence[len('saw '):]}" in first.message
    assert f"Fix: {f.fix}" in first.message
