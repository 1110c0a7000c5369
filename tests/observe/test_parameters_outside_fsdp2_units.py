"""Parameters outside every ``fully_shard`` unit (blind round 95 b_b02): a CLIP-style dual
encoder on FSDP2 keeps its learnable temperature in the criterion module, outside the
sharded model; it is a plain tensor FSDP2 never reduces, so each rank steps its own. Before,
FSDP2 runs were not compared across ranks at all (their shards differ by design): silent.
The observer now checksums the stepped parameters that are not DTensors and the ranks'
sums must agree (on the run's recording, 2 gloo ranks, first five steps); the twin that
all-reduces that gradient by hand is silent."""

from __future__ import annotations

from tests.helpers import judge_recorded


def test_temperature_outside_the_units_is_f10() -> None:
    errors = [f for f in judge_recorded("r95_fsdp2_temperature_outside_units")
              if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], errors
    assert "outside every fully_shard unit" in errors[0].title
    assert "logit_scale" in errors[0].evidence
    assert "fully_shard" in errors[0].fix


def test_temperature_reduced_by_hand_is_silent() -> None:
    findings = judge_recorded("r95_fsdp2_temperature_reduced_by_hand")
    assert not [f for f in findings if f.severity == "error"], findings
