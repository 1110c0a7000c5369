"""F14 from the loop's own cadence on 2 real DDP ranks: an optimizer wrapper that steps only
on every 2nd call of its own ``step()``, called by a loop that also gates it (DDP synchronised
at every 2nd backward, each loss / 2): the optimizer steps once every 2 of the loop's
windows. Correct twins: the wrapper called after every backward; a loop that synchronises
wastefully at every 2nd backward of a window of 4 but divides by the whole window (EXTRA_SYNC
only). One launch for the cases (tests/watch_sweep.py)."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

SCRIPT = textwrap.dedent('''
    import contextlib
    import sys

    import torch
    import torch.distributed as dist

    MODE = sys.argv[1]
    K = 2

    class Gated:
        """Steps the optimizer it holds on every `every`-th call only."""

        def __init__(self, opt, every):
            self.opt, self.every, self.calls = opt, every, 0

        def step(self):
            self.calls += 1
            if self.calls % self.every == 0:
                self.opt.step()
                self.opt.zero_grad()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(dist.get_rank())
    if MODE == "wasteful":  # windows of 2K, synchronised every K, loss over the whole window
        for i in range(6 * 2 * K):
            last = (i + 1) % K == 0
            with contextlib.nullcontext() if last else model.no_sync():
                x = torch.randn(4, 6, generator=gen)
                loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
                (loss / K / 2).backward()
            if (i + 1) % (2 * K) == 0:
                sgd.step()
                sgd.zero_grad()
    else:
        opt = Gated(sgd, K)
        for i in range(6 * K * K):
            last = (i + 1) % K == 0
            with contextlib.nullcontext() if last else model.no_sync():
                x = torch.randn(4, 6, generator=gen)
                loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
                (loss / K).backward()
            if MODE == "once" or last:  # "twice": the loop gates the wrapper too
                opt.step()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("double_gate"), SCRIPT, ("twice", "once", "wasteful"))


def test_a_wrapper_gated_by_the_loop_too_is_f14(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["twice"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F14"}, findings
    ev = errors[0]["evidence"]
    assert "after 4 backward passes" in ev and "windows are 2 micro-steps" in ev, ev
    assert "synchronised at backwards 2, 4 only" in ev and "divided by 2" in ev, ev
    # the extra syncs are the loop's window boundaries: no "communication cost only" beside it
    assert not [f for f in findings if f["cls"] == "EXTRA_SYNC"], findings


@pytest.mark.parametrize("mode", ["once", "wasteful"])
def test_one_gate_is_not_f14(runs: dict[str, Watched], mode: str) -> None:
    code, findings, _, proc = runs[mode]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
    if mode == "wasteful":
        assert [f for f in findings if f["cls"] == "EXTRA_SYNC"], findings
