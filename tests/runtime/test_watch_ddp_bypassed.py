"""F10 (the averaging over ranks is missing) when DDP's forward is bypassed: the loss computed
through ``ddp_model.module`` (a method of the wrapped module) so no backward comes from a
forward DDP ran, and DDP synchronises nothing (blind round 83 b_b03, with ZeroRedundancyOptimizer: the F11 said "sync flag wrong"
and told the user to move no_sync, which was not the fault). The finding names the bypass
and the fix; the same loop through the wrapper is silent. 2 gloo ranks, one launch."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

SCRIPT = textwrap.dedent('''
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    MODE = sys.argv[1]
    K = 2

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                            torch.nn.Linear(8, 1))

        def forward(self, x):
            return self.body(x)

        def compute_loss(self, x):
            return torch.nn.functional.mse_loss(self.body(x), x[:, :1])

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(4):
        for j in range(K):
            x = torch.randn(4, 5, generator=gen)
            if MODE == "bypass":
                loss = model.module.compute_loss(x)
            else:
                loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
            (loss / K).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("ddp_bypassed"), SCRIPT, ("bypass", "through"))


def test_a_bypassed_ddp_forward_is_named(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["bypass"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F10"}, findings
    f11 = errors[0]
    assert "never synchronise" in f11["title"], f11
    assert "ddp_model.module" in f11["evidence"], f11
    assert "ddp_model.module" in f11["fix"] and "no_sync" not in f11["fix"], f11


def test_the_loop_through_the_wrapper_is_silent(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["through"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
