"""Data parallelism by parameter averaging (blind round 91 c_b02: each rank steps AdamW on its
own gradient, then the ranks all-reduce and average ``p.data``): each rank's optimizer
receives exactly its own gradient and every collective runs before the next window's first
backward. With AdamW the average of the ranks' updates is not the update of the averaged
gradient: F10, titled by what was measured. With plain SGD (linear in the gradient, also
with momentum) parameter averaging is the large batch's update: nothing is said, not even
the generic F11 "ranks train different models" (the same recording with the optimizer's
name read as SGD). The rules run on the run's first five steps (2 ranks, spawned, gloo)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings

HERE = Path(__file__).parent / "recorded" / "r91_parameters_averaged_after_adamw"


def test_parameters_averaged_after_adamw_steps_is_f10() -> None:
    findings, _, _ = analyze(load_recordings(HERE))
    errors = [f for f in findings if f.severity == "error"]
    assert [f.cls for f in errors] == ["F10"], findings
    assert "parameters averaged after each rank's own step" in errors[0].title
    assert "AdamW" in errors[0].evidence


def test_parameters_averaged_after_sgd_steps_is_silent(tmp_path: Path) -> None:
    for f in HERE.glob("rank-*.jsonl"):
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        for d in lines:
            if d.get("kind") == "step":
                d["optimizer"] = "SGD"
        (tmp_path / f.name).write_text("".join(json.dumps(d) + "\n" for d in lines))
    findings, _, _ = analyze(load_recordings(tmp_path))
    assert not [f for f in findings if f.severity == "error"], findings
    shutil.rmtree(tmp_path)
