"""The one window record: its recording line is a stable format (``watch --report DIR``
reads rank files written by other nodes and other versions), it reads back to the same
record, and the guard's and the audit's counts read through it as they did."""

from __future__ import annotations

import json

import torch

from accumguard.core.window import AUDIT_COUNTS, Conservation, StepRecord, sum_records

#: the keys of a recording's step line, in order (a change here breaks other nodes' files)
LINE_KEYS = [
    "kind", "rank", "step", "backwards", "window_loss", "applied", "source", "optimizer",
    "engine", "zero_grads", "zero_grads_between", "scheduler_steps", "scheduler_positioned",
    "clips", "clip_micros",
    "clip_functions", "data_pass_starts", "reductions", "reduction_rounds", "sync_micros",
    "sync_mismatch", "sync_backward", "forwards", "ds_boundaries", "ds_coalescing", "ds_micro_ids",
    "engine_step_calls", "max_backwards_per_engine_step", "moved_without_backward",
    "grad_norm", "checksum", "wall", "param_dtype", "losses", "discarded", "rank_factor",
    "optimizer_index", "precision", "param_norm", "lr_changes", "lr", "terms", "in_backward",
    "backward_pass",
    "grad_hooks", "clip_before_unscale", "restarts", "opt_serial", "unborn", "rank_factor_units",
    "fsdp_mesh",
    "began_on_grad", "hook_in", "clip_empty", "clip_unset", "accelerate_blocks", "unwrapped", "loose_checksum", "join_initial",
    "pre_hooked", "grad_rescaled", "zero_micros", "lane_scales",
    "conservation",
]


def _cons(**kw: object) -> Conservation:
    base: dict[str, object] = dict(params=2, wiped=0.5, stale=0.0, received=0.25, ok=False,
                                   reason="wiped", first_wipe=1, wipes=(1,), lost=0.4,
                                   contrib_sums=(1.0, 2.0), received_sums=(0.5, 1.0))
    base.update(kw)
    return Conservation(**base)  # type: ignore[arg-type]


def _record(**kw: object) -> StepRecord:
    base: dict[str, object] = dict(
        step=3, backwards=4, window_loss=1.5, applied=True, source="torch", optimizer="SGD",
        engine="ddp", zero_grads=1, zero_grads_between=1, clip_micros=[2], clips=1,
        clip_functions=["clip_grad_norm_"], sync_micros=[False, False, False, True],
        forwards=[1, 1, 1, 1], conservation=_cons(), checksum=[1.0, 2.0, 3.0],
        updates={"w": torch.zeros(1)}, losses=[["a.py:3", 0, 0, 5, 0.05]])
    base.update(kw)
    return StepRecord(**base)  # type: ignore[arg-type]


def test_the_line_keeps_its_keys_and_no_tensors() -> None:
    line = _record().as_dict(rank=1)
    assert list(line) == LINE_KEYS
    assert line["kind"] == "step" and line["rank"] == 1
    json.dumps(line)  # JSON-safe: the updates' tensors are not in it
    # the per-parameter checksum columns only where the cross-rank fits read them: the
    # script's own all-reduce, or a DDP window whose conservation broke between backwards
    assert line["conservation"]["contrib_sums"] == [1.0, 2.0]  # (ddp, wiped)
    assert "contrib_sums" not in _record(engine="fsdp2").as_dict(rank=1)["conservation"]
    local = _record(engine="local", reductions=2).as_dict(rank=0)["conservation"]
    assert local["contrib_sums"] == [1.0, 2.0] and local["received_sums"] == [0.5, 1.0]


def test_a_line_reads_back_to_the_same_record() -> None:
    rec = _record(engine="local", reductions=2, updates=None)
    line = json.loads(json.dumps(rec.as_dict(rank=0)))
    assert StepRecord.from_dict(line) == rec
    trimmed = _record(engine="fsdp2", updates=None)  # columns dropped on the line: defaults back
    back = StepRecord.from_dict(json.loads(json.dumps(trimmed.as_dict(rank=0))))
    assert back.conservation == _cons(contrib_sums=(), received_sums=())


def test_an_older_or_newer_line_still_loads() -> None:
    old = {"kind": "step", "rank": 0, "step": 0, "backwards": 2, "window_loss": None,
           "applied": True, "source": "torch", "optimizer": "SGD",
           "conservation": {"params": 1, "wiped": 0.0, "stale": 0.0, "received": 0.0,
                            "ok": True, "reason": "", "a_later_key": 1},
           "a_later_key": [1, 2]}
    rec = StepRecord.from_dict(old)
    assert rec.backwards == 2 and rec.sync_micros == [] and rec.conservation is not None
    assert rec.conservation.ok and rec.conservation.wipes == ()


def test_the_guard_and_the_audit_read_their_counts_through_it() -> None:
    w = StepRecord(step=2, backwards=4, sync_micros=[None, True, False, True])
    assert (w.index, w.backward_passes, w.sync_rounds) == (2, 4, 2)
    a = StepRecord(step=0, backwards=3, zero_grads=1, zero_grad_calls=2, forward_calls=3)
    b = StepRecord(step=1, backwards=1, gradless_steps=2, optimizer_steps=0)
    counts = a.audit_counts()
    assert list(counts) == list(AUDIT_COUNTS)
    assert (counts["backward"], counts["zero_grad"], counts["zero_grad_in_window"],
            counts["forward"], counts["optimizer_steps"]) == (3, 2, 1, 3, 1)
    total = sum_records([a, b]).audit_counts()
    assert (total["backward"], total["optimizer_steps"], total["gradless_steps"]) == (4, 1, 2)


def test_the_old_names_still_import_with_a_warning() -> None:
    """One release of grace for glue written against the old record types."""
    import pytest

    from accumguard import invariance
    from accumguard.runtime import guard
    from accumguard.verify import audit, report

    with pytest.warns(DeprecationWarning, match="core.window.StepRecord"):
        assert guard.WindowRecord is StepRecord  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="AuditStep"):
        assert audit.StepRecord is report.AuditStep  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="StepRow"):
        assert invariance.StepRecord is invariance.StepRow  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="audit_counts"):
        old = report.StepCounts(backward=4, zero_grad=1)  # type: ignore[attr-defined]
    assert (old.backward, old.zero_grad, old.optimizer_steps) == (4, 1, 0)
