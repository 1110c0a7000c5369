"""F6 on 2 real DDP ranks under ``Join`` with uneven inputs: rank 0 has one more window of
data than rank 1; in that last step DDP divides rank 0's gradient by the launch's world
size (``divide_by_initial_world_size=True``, the default), half the mean of the micro-batches
that trained. Twin: ``divide_by_initial_world_size=False`` divides by the ranks still
training: silent. One launch for both (tests/watch_sweep.py)."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

SCRIPT = textwrap.dedent('''
    import contextlib
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.join import Join

    MODE = sys.argv[1]
    K = 2
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    windows = 3 if rank == 0 else 2  # uneven shards: rank 0 has one more window
    with Join([model], divide_by_initial_world_size=MODE == "initial"):
        for _ in range(windows):
            for m in range(K):
                x, y = torch.randn(4, 6, generator=gen), torch.randint(0, 3, (4,), generator=gen)
                with model.no_sync() if m < K - 1 else contextlib.nullcontext():
                    (F.cross_entropy(model(x), y) / K).backward()
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("ddp_join"), SCRIPT, ("initial", "effective"))


def test_steps_of_the_remaining_rank_divided_by_the_full_world_are_f6(
        runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["initial"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F6"}, findings
    ev = errors[0]["evidence"]
    assert "ran on rank(s) [0] only" in ev and "1/2 of the mean" in ev, ev
    assert "divide_by_initial_world_size=False" in errors[0]["fix"], errors[0]


def test_join_dividing_by_the_ranks_still_training_is_silent(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["effective"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
