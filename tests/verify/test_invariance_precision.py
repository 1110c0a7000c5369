"""``accumguard invariance`` on synthetic recordings: the tolerance derived from the
recorded compute/weight dtypes and K (the audit's model), and scripts that are not
K-invariant by construction (BatchNorm in train mode, in-batch negatives). Real runs:
tests/verify/test_invariance_precision_runs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from test_invariance import write_run

from accumguard.invariance import build_report, load_run


def _annotate(d: Path, **fields: Any) -> Path:
    """Add fields to every step record of a written run."""
    for path in d.glob("rank-*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "step":
                rec.update(fields)
            lines.append(json.dumps(rec))
        path.write_text("\n".join(lines) + "\n")
    return d


def _runs(tmp: Path, scale: float, **fields: Any) -> list[Any]:
    ref = _annotate(write_run(tmp / "k1", k=1, dtype="float32"), **fields)
    run = _annotate(write_run(tmp / "k256", k=256, dtype="float32",
                              update_scale=lambda s, r: 1.0 + scale), **fields)
    return [load_run(ref, k=1), load_run(run, k=256)]


BF16_MASTERS = {"precision": {"compute": "bfloat16", "autocast": "bfloat16"}}


@pytest.mark.parametrize(("scale", "diverged"), [(3e-4, False), (2e-2, True)])
def test_bf16_compute_fp32_weights(tmp_path: Path, scale: float, diverged: bool) -> None:
    """fp32 weights, bf16 compute: a correct run (3e-4 apart, as measured) agrees at the
    bf16 bound (1e-4 + 2u = 7.9e-3); one summed in bf16 at K = 256 (2e-2) does not."""
    report = build_report(_runs(tmp_path, scale, **BF16_MASTERS), command=["x"], batch=None,
                          steps=3)
    assert report.tolerance == pytest.approx(1e-4 + 2 * 2 ** -8)
    assert "bf16 compute" in report.tolerance_reason and "fp32 weights" in report.tolerance_reason
    assert report.diverged is diverged and report.exit_code == int(diverged)


def test_fp32_stays_at_1e4(tmp_path: Path) -> None:
    report = build_report(_runs(tmp_path, 3e-4), command=["x"], batch=None, steps=3)
    assert report.tolerance == 1e-4 and report.diverged  # 3e-4 is a difference in fp32


def test_bf16_weights_add_their_rounding(tmp_path: Path) -> None:
    """bf16 weights: updates below a weight's ulp round away, differently per run; the bound
    grows by 2(s+1)u*|theta|/|dtheta| (here |theta| = 50 |dtheta|: 0.39 at step 1)."""
    runs = _runs(tmp_path, 0.2, precision={"compute": "bfloat16"}, param_norm=1.0,
                 param_dtype="bfloat16")
    nref = runs[0].updates[0][0]
    norm = float(sum(float(t.double().pow(2).sum()) for t in nref.values())) ** 0.5
    for r in runs:  # |theta| = 50 x the (per-rank) update norm
        r.param_norms = {i: 50 * norm * 2 ** 0.5 for i in r.param_norms}
    report = build_report(runs, command=["x"], batch=None, steps=3)
    step1 = report.comparisons[0].steps[0]
    assert step1.tolerance == pytest.approx(report.tolerance + 2 * 2 ** -8 * 50, rel=1e-6)
    assert not report.diverged


def test_low_precision_accumulation_is_listed(tmp_path: Path) -> None:
    fsdp = {"precision": {"compute": "bfloat16", "fsdp": {
        "compute": "bfloat16", "deferred": "bfloat16", "synced": "float32"}},
        "sync_micros": [False, True]}
    runs = _runs(tmp_path, 2e-2, **fsdp)
    assert runs[1].low_accumulation == ["FSDP2 reduce_dtype bfloat16 (sync off between "
                                        "micro-steps)"]
    assert runs[1].summary()["low_precision_accumulation"] == runs[1].low_accumulation


def test_not_invariant_by_construction(tmp_path: Path) -> None:
    runs = _runs(tmp_path, 0.3)
    (runs[1].observe_dir / "construction-rank-0.json").write_text(json.dumps(
        ["BatchNorm1d(16) normalises with the micro-batch's own statistics (train mode)"]))
    runs = [load_run(r.observe_dir, k=r.k) for r in runs]
    report = build_report(runs, command=["x"], batch=None, steps=3)
    c = report.comparisons[0]
    assert not report.diverged and report.by_construction and report.exit_code == 0
    assert c.first_divergent_step == 1 and "BatchNorm1d(16)" in c.construction[0]
    assert any("not K-invariant by construction" in n for n in c.notes)
    # the accumulation is still judged: a watch error on that run fails the command
    report.findings[256] = [{"cls": "F4", "severity": "error"}]
    assert report.exit_code == 1
    from accumguard.cli.invariance import format_text

    report.findings[256] = []
    text = format_text(report)
    assert "NOT K-INVARIANT BY CONSTRUCTION: K=256" in text and "DIVERGED" not in text
    assert "differs (by construction)" in text
    data = report.to_dict()
    assert data["not_invariant_by_construction"] is True and data["diverged"] is False


def test_probes_note_batchnorm_and_in_batch_negatives(tmp_path: Path) -> None:
    """The probes themselves, in-process: train-mode BatchNorm and an [n, n] cross-entropy
    with targets arange(n) are noted; eval-mode BatchNorm and a classifier's CE are not."""
    from accumguard.observe.invariance_construction import install_probes

    patches = install_probes(tmp_path)
    try:
        bn = torch.nn.BatchNorm1d(4)
        bn.eval()
        bn(torch.randn(3, 4))
        torch.nn.functional.cross_entropy(torch.randn(3, 5), torch.tensor([0, 1, 2]))
        assert not list(tmp_path.glob("construction-rank-*.json"))
        bn.train()
        bn(torch.randn(3, 4))
        z = torch.randn(4, 8)
        torch.nn.functional.cross_entropy(z @ z.T, torch.arange(4))
    finally:
        patches.undo()
    seen = json.loads((tmp_path / "construction-rank-0.json").read_text())
    assert len(seen) == 2 and any("BatchNorm1d(4)" in s for s in seen)
    assert any("in-batch negatives" in s and "test_invariance_precision.py:" in s for s in seen)


def _bn_contrastive_training() -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        z = model(torch.randn(4, 6))
        torch.nn.functional.cross_entropy(z @ z.T, torch.arange(4)).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("fault", ["_BatchNorm.forward:pre@1", "_BatchNorm.forward:post@2",
                                   "torch.nn.functional.cross_entropy:pre@1",
                                   "torch.nn.functional.cross_entropy:post@2"])
def test_a_probe_fault_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       fault: str) -> None:
    """The probes' doors: an internal error switches them off, the training is unchanged."""
    from accumguard.observe._failsafe import ENV_FAULT
    from accumguard.observe.invariance_construction import install_probes

    plain = _bn_contrastive_training()
    original = torch.nn.functional.cross_entropy
    monkeypatch.setenv(ENV_FAULT, fault)
    patches = install_probes(tmp_path)
    try:
        probed = _bn_contrastive_training()
    finally:
        patches.undo()
    failure = patches.failsafe.failure if patches.failsafe is not None else None
    assert failure is not None and "InjectedFault" in failure.error
    assert torch.nn.functional.cross_entropy is original
    for a, b in zip(plain, probed, strict=True):
        assert torch.equal(a, b), fault
