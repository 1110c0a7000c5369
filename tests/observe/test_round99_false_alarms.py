"""Two correct loops of blind round 99 that watch called errors, recorded on 2 gloo ranks
(first steps):

* DeepSpeed ZeRO-2, ``gradient_accumulation_steps`` 4: the window's 4 backwards in one
  ``engine.coalesce_grad_reduction()`` block, then 4 ``engine.step()`` calls (the engine
  steps at the 4th). The optimizer stepped after exactly the engine's 4 backwards: its own
  accumulation, not double gating (F14 before).
* FSDP2 on a model cast to bf16, ``reduce_dtype`` float32, sync only on the last of 8
  micro-steps: FSDP2 sums the window in its fp32 unsharded gradient and writes the bf16
  sharded ``.grad`` once: no bf16 accumulation (F12 before). Its buggy twin, synced on every
  micro-step, adds 8 reduced gradients into the bf16 sharded ``.grad``: F12 stays, counted
  in syncs."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_one_coalesced_window_then_k_engine_steps_is_not_double_gating() -> None:
    found = judge_recorded("r99_ds_coalesced_window_then_k_steps")
    assert [f for f in found if f.severity in ("error", "warning")] == [], found


def test_fsdp2_bf16_parameters_summed_in_fp32_between_syncs_is_not_f12() -> None:
    found = judge_recorded("r99_fsdp2_bf16_params_fp32_reduce_deferred")
    assert [f for f in found if f.severity in ("error", "warning")] == [], found


def test_fsdp2_bf16_sharded_grad_summed_over_every_sync_is_f12() -> None:
    errors = [f for f in judge_recorded("r99_fsdp2_bf16_params_synced_every_micro_step")
              if f.severity == "error"]
    assert {f.cls for f in errors} == {"F12"}, errors
    assert "one addition per synchronised micro-step (8 of 8)" in errors[0].evidence
