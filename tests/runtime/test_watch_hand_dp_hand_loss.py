"""F10 for data parallelism written by hand whose loss is built by hand too (a DPO-style
``-logsigmoid(margin).mean() / K``, no ``cross_entropy``): the gradients all-reduced with SUM
once per window and never divided by W make every update W x too large (blind round 83
c_b01: the divisor read ``WORLD_SIZE`` from an environment ``mp.spawn`` never sets). The
loss weights come from the hand-built mean's records. Two real gloo ranks, one launch."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

SCRIPT = textwrap.dedent('''
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    MODE = sys.argv[1]
    K = 3
    dist.init_process_group("gloo")
    W = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    gen = torch.Generator().manual_seed(10 + dist.get_rank())
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        for _ in range(K):
            good, bad = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
            margin = model(good).squeeze(1) - model(bad).squeeze(1)
            (-F.logsigmoid(margin).mean() / K).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if MODE == "avg":
            flat /= W
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        opt.step()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("hand_dp_hand_loss"), SCRIPT, ("sum", "avg"))


def test_a_sum_never_divided_by_w_is_f10(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["sum"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F10"}, findings
    assert "2x too large" in errors[0]["evidence"], errors[0]


def test_the_average_is_silent(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["avg"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
