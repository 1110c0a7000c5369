"""Blind round 109 c_b03 (recorded on 2 gloo ranks): an optimizer wrapper that steps and
clears on every K-th call of its ``step()``, called by a loop that already calls it only
every K-th micro-batch: the optimizer steps once every K x K backwards. The script declares
K (``GRAD_ACCUM = 2``) and divides every loss by it, the windows are 4 backwards: the step is
gated twice (F14). The sync follows the wrapper, so the collective ledger does not show the
loop's windows; the script's declaration does. The twin calls the wrapper every micro-batch."""

from __future__ import annotations

from accumguard.observe.rules import analyze
from accumguard.watch._declared import ScriptK
from accumguard.watch._findings import load_recordings
from tests.helpers import RECORDED

K_SCRIPT = ScriptK(name="GRAD_ACCUM", value=2, path="c_b03.py", line=15, how="assignment",
                   divides_loss=True, divide_line=94)


def _errors(name: str, script: ScriptK | None) -> list[object]:
    findings, _, _ = analyze(load_recordings(RECORDED / name), script=script)
    return [f for f in findings if f.severity == "error"]


def test_a_wrapper_gating_again_the_loops_windows_of_declared_k_is_f14() -> None:
    errors = _errors("r109_wrapper_counts_calls_loop_gates_too", K_SCRIPT)
    assert [f.cls for f in errors] == ["F14", "F14"], errors  # one per rank
    assert "2 x K" in errors[0].evidence and "GRAD_ACCUM = 2" in errors[0].evidence


def test_the_wrapper_called_every_micro_step_is_silent() -> None:
    assert _errors("r109_wrapper_counts_calls_every_micro_step", K_SCRIPT) == []


def test_without_the_scripts_declaration_nothing_is_claimed() -> None:
    assert _errors("r109_wrapper_counts_calls_loop_gates_too", None) == []
