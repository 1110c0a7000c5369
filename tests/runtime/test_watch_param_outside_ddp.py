"""F10 on 2 real DDP ranks: the optimizer also steps a parameter that no DDP-wrapped module
holds (CLIP's learnable temperature kept in the loss module): DDP averages its own module's
gradients only, so each rank steps that one on its own gradient and the ranks drift apart.
Correct twin: the loop all-reduces that parameter's gradient (sum / W) before the step. One
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
    K = 2

    class ContrastiveLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.logit_scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, a, b):
            logits = self.logit_scale.exp() * a @ b.t()
            return F.cross_entropy(logits, torch.arange(len(a)))

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    encoder = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 4))
    crit = ContrastiveLoss()
    opt = torch.optim.SGD([*encoder.parameters(), *crit.parameters()], lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for step in range(4):
        for m in range(K):
            x, y = torch.randn(5, 6, generator=gen), torch.randn(5, 6, generator=gen)
            a = F.normalize(encoder(x), dim=-1)
            with torch.no_grad():
                b = F.normalize(torch.nn.functional.linear(y, encoder.module.weight), dim=-1)
            if m < K - 1:
                with encoder.no_sync():
                    (crit(a, b) / K).backward()
            else:
                (crit(a, b) / K).backward()
        if MODE == "synced":
            dist.all_reduce(crit.logit_scale.grad)
            crit.logit_scale.grad /= dist.get_world_size()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("outside_ddp"), SCRIPT, ("loose", "synced"))


def test_a_parameter_outside_ddp_stepped_on_each_ranks_gradient_is_f10(
        runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["loose"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F10"}, findings
    assert "logit_scale" in errors[0]["evidence"], errors[0]
    assert "parameters that DDP does not reduce" in errors[0]["evidence"], errors[0]


def test_the_same_parameter_all_reduced_by_hand_is_silent(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["synced"]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
