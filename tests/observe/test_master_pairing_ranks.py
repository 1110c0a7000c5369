"""Blind round 112 (c_b02), recorded on 2 gloo ranks: bf16 weights with fp32 master copies
stepped by SGD, the K = 4 backwards summed in the model's bf16 ``.grad`` and harvested into
the masters once per window, then one hand all-reduce (a mean) of the masters' gradients.
No rank alone can pair its optimizer's gradient with its own bf16 sum (the all-reduce mixed
in the other rank's); the ranks' sums added up pair with it (``pair_master_sums``): F12 is an
error. The twin harvests after every backward (the sum is fp32): silent."""

from __future__ import annotations

import copy
from typing import Any

from accumguard.observe._precision_rules import pair_master_sums
from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from tests.helpers import RECORDED, judge_recorded


def test_a_bf16_sum_behind_a_hand_all_reduce_is_confirmed_across_ranks() -> None:
    errors = [f for f in judge_recorded("r112_master_bf16_sum_hand_allreduce")
              if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"F12"}, errors
    assert "could not be paired" not in errors[0].evidence
    assert "master weights" in errors[0].evidence


def test_the_twin_summing_in_fp32_is_silent() -> None:
    found = judge_recorded("r112_master_fp32_per_micro_hand_allreduce")
    assert [f for f in found if f.severity != "note"] == [], found


def test_optimizer_gradients_that_are_not_the_ranks_sum_stay_unconfirmed() -> None:
    rec = load_recordings(RECORDED / "r112_master_bf16_sum_hand_allreduce")
    bent = copy.deepcopy(rec)
    for line in bent.steps[1]:
        master: Any = (line.get("precision") or {}).get("model_grad")
        if isinstance(master, dict) and master.get("recv"):
            master["recv"] = [x * (1.5 if i % 2 else 0.5) for i, x in enumerate(master["recv"])]
    assert pair_master_sums(copy.deepcopy(rec)) > 0
    assert pair_master_sums(bent) == 0
    found, _, _ = analyze(bent)
    f12 = [f for f in found if f.cls == "F12"]
    assert f12 and all(f.severity == "warning" for f in f12), f12
