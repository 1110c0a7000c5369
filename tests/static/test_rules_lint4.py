"""Blind round 16's lint misses, by class: each corpus script below must be flagged at
**error** level (the corpus test checks code and line, not severity), and the eval's
wrong-class error (AG112 on a rank-local token count) must stay away from its twins."""

from __future__ import annotations

from pathlib import Path

import pytest

from accumguard.static import Severity
from accumguard.static.lint import lint_file

CORPUS = Path(__file__).resolve().parents[1] / "lint_corpus"

ERRORS = {
    # AG127: a term divided by K through a local name, another added undivided
    "bug_aux_named_term_divided_apart.py": "AG127",
    "bug_moe_balance_attr_scaled_lm_first.py": "AG127",
    # AG115: a flag computed from `step % K == 0` with the counter from 0
    "bug_ddp_flag_from_zero_gates_sync.py": "AG115",
    "bug_trainer_sync_flag_counter_from_zero.py": "AG115",
    # AG117: the epoch length evident through a loader/data-set factory function
    "bug_epoch_leak_loader_factory.py": "AG117",
    "bug_epoch_fn_leak_dataset_factory.py": "AG117",
    # ... and through `net, data = setup()` (a name resolved in the function that reads it)
    "bug_epoch_leak_tuple_from_builder.py": "AG117",
    # AG120: a bf16/fp16 model with a literal K at or above the F12 error threshold
    "bug_half_model_guarded_k256.py": "AG120",
    "bug_bf16_trainer_class_range_k.py": "AG120",
    # AG110: the DeepSpeed config is a dict returned by a function of the file
    "bug_ds_config_factory_named_then_gated.py": "AG110",
    "bug_ds_config_builder_inline_window_loop.py": "AG110",
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_flagged_as_error(name: str) -> None:
    found = [f for f in lint_file(CORPUS / name) if f.code == ERRORS[name]]
    assert found, name
    assert all(f.severity is Severity.ERROR for f in found), [(f.code, f.severity) for f in found]


@pytest.mark.parametrize("name", ["bug_ddp_local_count_from_rank_shard.py", "ok_ddp_len_micro_from_world_helper.py",
                                  "ok_ddp_global_count_from_rank_shard.py"])
def test_data_built_with_the_world_size_is_not_the_world_size(name: str) -> None:
    """``shard = split(rank, world_size)``: a count or ``len()`` of that data is no world size."""
    assert not [f for f in lint_file(CORPUS / name) if f.code == "AG112"]
