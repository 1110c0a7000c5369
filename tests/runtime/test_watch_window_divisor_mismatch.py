"""F13 from the loss weights on 2 real DDP ranks: a trainer whose micro-step counter runs on
across epochs (10 micro-batches an epoch, K = 4) while each micro-batch's divisor follows
its position in the epoch (the epoch's last 2 are divided as a short window of 2): the
second epoch's windows are 2/4/4, and its last one mixes micro-batches divided for a window
of 4 with ones divided for a window of 2. The twin resets the counter each epoch. One
launch for both (tests/watch_sweep.py)."""

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
    K, PER_EPOCH, MB = 4, 10, 3
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    tail = PER_EPOCH % K
    count = 0
    for epoch in range(2):
        if MODE == "reset":
            count = 0
        for i in range(PER_EPOCH):
            count += 1
            boundary = count % K == 0 or i == PER_EPOCH - 1
            size = tail if i >= PER_EPOCH - tail else K
            x, y = torch.randn(MB, 6, generator=gen), torch.randint(0, 5, (MB,), generator=gen)
            loss = F.cross_entropy(model(x), y, reduction="sum") / (size * MB)
            if boundary:
                loss.backward()
                opt.step()
                opt.zero_grad()
            else:
                with model.no_sync():
                    loss.backward()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("divisor_mismatch"), SCRIPT, ("carry", "reset"))


def test_a_window_normalised_for_two_sizes_is_f13(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["carry"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F13"}, findings
    ev = errors[0]["evidence"]
    assert "micro-steps 1-2 as one of a window of 4; micro-steps 3-4 as one of a window of 2" \
        in ev, ev
    assert "2x apart" in ev and "reset the micro-step counter" in errors[0]["fix"], errors[0]


def test_the_counter_reset_each_epoch_has_no_error(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["reset"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
