"""Severities of the rules added for the eval15 classes (AG129-AG133).

The corpus test checks code and line; a rule that is an error only when the source proves
the bug (and a warning otherwise) needs its severity checked too: each row is a corpus
script, the code it must emit, and that finding's severity.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accumguard.static import Severity
from accumguard.static.lint import lint_file

CORPUS = Path(__file__).resolve().parents[1] / "lint_corpus"

CASES = [
    ("bug_rl_grpo_mask_mean_no_k.py", "AG129", Severity.ERROR),
    ("bug_rl_pg_helper_masked_mean.py", "AG129", Severity.ERROR),
    ("bug_rl_pg_helper_masked_mean_over_k.py", "AG104", Severity.WARNING),
    ("bug_nanogpt_lr_micro_iter_while.py", "AG130", Severity.ERROR),
    ("bug_lr_flat_loop_index_schedule.py", "AG130", Severity.ERROR),
    ("bug_lr_inline_warmup_trainer.py", "AG130", Severity.WARNING),
    ("bug_accelerate_horizon_prepared_len.py", "AG125", Severity.ERROR),
    ("bug_lightning_limit_batches_below_k.py", "AG131", Severity.ERROR),
    ("bug_lightning_short_epoch_tensor_loader.py", "AG131", Severity.ERROR),
    ("bug_lightning_limit_batches_tail.py", "AG131", Severity.WARNING),
    ("bug_hf_trainer_mixtral_router_logits.py", "AG132", Severity.ERROR),
    ("bug_hf_trainer_qwen2moe_subclass_attr.py", "AG132", Severity.ERROR),
    ("bug_hf_trainer_auto_moe_router_logits.py", "AG132", Severity.WARNING),
]


@pytest.mark.parametrize(("script", "code", "severity"), CASES, ids=[c[0] for c in CASES])
def test_severity(script: str, code: str, severity: Severity) -> None:
    found = [f for f in lint_file(CORPUS / script) if f.code == code]
    assert found, f"{script}: no {code}"
    assert {f.severity for f in found} == {severity}
