"""F4 on DeepSpeed's own LR schedulers (``deepspeed.runtime.lr_schedules``), which are no torch
``LRScheduler``: the engine steps the one its config names once per optimizer step, so a
``total_num_steps`` counted in micro-batches (epochs x batches, no / GA) ends K x late. Two
real DeepSpeed ranks (ZeRO-1, GA = K = 4), one launch for the cases (tests/watch_sweep.py)."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

SCRIPT = textwrap.dedent('''
    import sys

    import deepspeed
    import torch

    MODE = sys.argv[1]
    K, STEPS = 4, 5
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    kind = "WarmupCosineLR" if MODE == "cosine_micro" else "WarmupDecayLR"
    total = STEPS * K if MODE.endswith("micro") else STEPS  # micro-batches vs optimizer steps
    params = {"total_num_steps": total, "warmup_num_steps": 1}
    if kind == "WarmupDecayLR":
        params.update(warmup_min_lr=0.0, warmup_max_lr=1e-2)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": K,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "scheduler": {"type": kind, "params": params}}
    engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                           model_parameters=model.parameters())
    gen = torch.Generator().manual_seed(engine.global_rank)
    for _ in range(STEPS * K):
        x = torch.randn(4, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    pytest.importorskip("deepspeed")
    return torchrun_modes(tmp_path_factory.mktemp("ds_schedule"), SCRIPT, ("decay_micro", "cosine_micro", "decay_ok"))


@pytest.mark.parametrize("mode", ["decay_micro", "cosine_micro"])
def test_a_horizon_in_micro_batches_ends_k_times_late(runs: dict[str, Watched],
                                                       mode: str) -> None:
    code, findings, _, proc = runs[mode]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F4"}, findings
    f4 = errors[0]
    assert "4x late (K = 4)" in f4["evidence"], f4
    assert "total_num_steps=20) was at scheduler step 5 of its 20" in f4["evidence"], f4
    assert "counts micro-batches" in f4["evidence"]
    assert "total_num_steps" in f4["fix"] and "gradient_accumulation_steps" in f4["fix"]


def test_a_horizon_in_optimizer_steps_is_silent(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["decay_ok"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["cls"] == "F4"], findings

