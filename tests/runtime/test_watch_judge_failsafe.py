"""accumguard's own bug in the judge never costs the user the other findings, and never
reads as a pass: a rule that raises is isolated and named, a judge that fails as a whole
says nothing was judged, and the exit code says accumguard failed (rule 1 of the brief:
an internal failure is reported as accumguard's own, never as "no finding")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe import rules
from accumguard.watch import recording
from accumguard.watch._report import EXIT_ACCUMGUARD_FAILED, judge

K = 3


def _record(out: Path, *, clip_inside: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(out):
        for _ in range(3):
            for i in range(K):
                x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
                (F.cross_entropy(model(x), y) / K).backward()
                if clip_inside and i == 0:  # clipping a partial sum: F8
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            opt.step()
            opt.zero_grad()


def _boom(*_a: object, **_k: object) -> list[object]:
    raise ZeroDivisionError("a rule's own bug")


def test_a_raising_rule_is_named_and_the_others_still_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, clip_inside=True)
    monkeypatch.setattr(rules, "loss_scale_findings", _boom)
    res = judge(tmp_path, accumulation_steps=K)
    assert "F8" in {f.cls for f in res.errors}, res.findings  # another rule's error kept
    failed = "\n".join(res.report["accumguard_failed"])
    assert "loss_scale_findings" in failed and "ZeroDivisionError" in failed, failed
    assert "not judged" in failed
    assert res.exit_code == 1  # an error was proven: that decides the exit code


def test_a_raising_rule_on_a_clean_run_is_not_a_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, clip_inside=False)
    monkeypatch.setattr(rules, "ledger_findings", _boom)
    res = judge(tmp_path, accumulation_steps=K)
    assert not res.errors
    assert res.exit_code == EXIT_ACCUMGUARD_FAILED
    assert any("ledger_findings" in line for line in res.report["accumguard_failed"])


def test_a_judge_failing_as_a_whole_says_nothing_was_judged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, clip_inside=True)
    monkeypatch.setattr(rules, "resolve_k", _boom)  # outside the isolated rules
    res = judge(tmp_path, accumulation_steps=K)
    assert res.findings == [] and res.report["checked"] is False
    assert res.exit_code == EXIT_ACCUMGUARD_FAILED
    assert "ZeroDivisionError" in res.report["accumguard_failed"][0]
    # the command's own failure code is kept: it says more than accumguard's
    assert judge(tmp_path, accumulation_steps=K, code=7).exit_code == 7


def test_the_cli_prints_a_failed_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from accumguard.cli.watch import _print

    _record(tmp_path, clip_inside=False)
    monkeypatch.setattr(rules, "resolve_k", _boom)
    res = judge(tmp_path, accumulation_steps=K)
    _print(res.report, res.findings)
    err = capsys.readouterr().err
    assert "accumguard FAILED while judging" in err and "nothing was checked" in err
