"""F4 for a learning rate written by hand, on 2 real DDP ranks. minGPT's schedule counts
the tokens consumed (all-reduced over the ranks) and rewrites the rate after every
micro-step's backward: only the rate at the step reaches the update, and the large batch
consumes the same tokens per step, so it is right: no error (a warning says both readings,
since a counter of micro-steps moves the rate alike). A schedule read from a micro-step
counter whose lengths count optimizer steps, and which the run outlives, ends K x early: an
error. One launch for both (tests/watch_sweep.py)."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

SCRIPT = textwrap.dedent('''
    import math
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    MODE = sys.argv[1]
    K, STEPS, MB, T = 3, 12, 4, 5
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 7))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(dist.get_rank())
    final_tokens = STEPS * K * MB * T * dist.get_world_size()
    tokens, micro = 0, 0
    for step in range(STEPS):
        for m in range(K):
            x = torch.randn(MB * T, 6, generator=gen)
            y = torch.randint(0, 7, (MB * T,), generator=gen)
            if m < K - 1:
                with model.no_sync():
                    (F.cross_entropy(model(x), y) / K).backward()
            else:
                (F.cross_entropy(model(x), y) / K).backward()
            if MODE == "tokens":  # minGPT: the rate from the tokens consumed so far
                n = torch.tensor(MB * T)
                dist.all_reduce(n)
                tokens += int(n)
                lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * min(1.0, tokens / final_tokens)))
            else:  # a micro-step counter, a horizon of STEPS (meant as optimizer steps)
                micro += 1
                lr = 1e-3 * max(0.0, 1 - micro / STEPS)
            for g in opt.param_groups:
                g["lr"] = lr
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("lr_by_hand"), SCRIPT, ("tokens", "counter"))


def test_mingpt_token_schedule_is_not_an_error(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["tokens"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
    f4 = [f for f in findings if f["cls"] == "F4"]
    assert f4 and {f["severity"] for f in f4} == {"warning"}, findings
    assert "counts data consumed" in f4[0]["evidence"], f4[0]


def test_a_micro_step_counter_schedule_ending_early_is_an_error(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["counter"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F4"}, findings
    assert "reached its end 3 x early" in errors[0]["evidence"], errors[0]
