"""A lint rule that raises on a script (a bug of accumguard's, on code it has never seen) is
reported as accumguard's own failure, naming the rule, and costs only that rule's findings:
the other rules still run and their findings are printed; the CLI exits 2, not 0 ("clean")."""

from __future__ import annotations

from pathlib import Path

import pytest

from accumguard.cli.lint import lint_main
from accumguard.static.lint import registry
from accumguard.static.lint.runner import RuleFailure, lint_paths, lint_source

BUGGY = """\
grad_accum_steps = 4
for i, batch in enumerate(loader):
    loss = model(batch) / grad_accum_steps
    loss.backward()
    optimizer.step()
"""


@pytest.fixture
def broken_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(ctx: object) -> list[object]:
        raise KeyError("a shape the rule never met")

    checks = registry.all_checks()
    monkeypatch.setattr(registry, "all_checks",
                        lambda: [registry.Check(("AG105",), "test", explode), *checks])


def test_a_failing_rule_keeps_the_others_findings(tmp_path: Path, broken_rule: None) -> None:
    script = tmp_path / "train.py"
    script.write_text(BUGGY)
    findings, errors = lint_paths([script])
    assert [f.code for f in findings] == ["AG101"]  # the step every micro-batch, still found
    assert len(errors) == 1 and isinstance(errors[0], RuleFailure)
    msg = errors[0].message
    assert "rule explode (AG105) failed" in msg and "KeyError" in msg
    assert "its findings are missing, the other rules ran" in msg
    with pytest.raises(RuleFailure) as caught:
        lint_source(BUGGY)
    assert [f.code for f in caught.value.findings] == ["AG101"]


def test_the_cli_says_so_and_does_not_exit_clean(tmp_path: Path, broken_rule: None,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(BUGGY)
    code = lint_main([str(script)])
    out, err = capsys.readouterr()
    assert code == 2
    assert "AG101" in out
    assert "accumguard's rule explode (AG105) failed on this file" in err
