"""F14 on 2 real ranks under Accelerate: each ``accumulate()`` block runs a whole window of
K backwards (each loss / K) while the Accelerator accumulates K too, so it steps once every
K blocks (K x K micro-batches). Correct twins: the same loop with an Accelerator that
accumulates nothing; and a block running two backwards of full weight (two losses, each
divided by Accelerate's K only), whose longer windows are no double gating. (One forward
with two backwards under DDP is not such a twin: DDP reduces the first backward only, and
watch says so, F11.) One launch for
the cases (tests/watch_sweep.py)."""

from __future__ import annotations

import textwrap

import pytest
from watch_sweep import Watched, torchrun_modes

pytest.importorskip("accelerate")

SCRIPT = textwrap.dedent('''
    import sys

    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator

    MODE = sys.argv[1]
    K = 3
    acc = Accelerator(cpu=True, gradient_accumulation_steps=1 if MODE == "once" else K)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    gen = torch.Generator().manual_seed(acc.process_index)
    for _ in range(4 * K):
        with acc.accumulate(model):
            if MODE == "two_losses":  # two batches, two backwards of full weight per block
                for _ in range(2):
                    x = torch.randn(4, 6, generator=gen)
                    acc.backward(F.mse_loss(model(x), x[:, :2]))
            else:  # the loop groups K micro-batches itself, each loss / K
                for _ in range(K):
                    x = torch.randn(4, 6, generator=gen)
                    acc.backward(F.mse_loss(model(x), x[:, :2]) / K)
            opt.step()
            opt.zero_grad()
    print("trained")
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    return torchrun_modes(tmp_path_factory.mktemp("acc_block"), SCRIPT,
                          ("twice", "once", "two_losses"))


def test_a_block_running_a_window_under_accelerate_k_is_f14(runs: dict[str, Watched]) -> None:
    code, findings, _, proc = runs["twice"]
    assert "trained" in proc.stdout
    errors = [f for f in findings if f["severity"] == "error"]
    assert code == 1 and {f["cls"] for f in errors} == {"F14"}, findings
    ev = errors[0]["evidence"]
    assert "of 3 accumulate() blocks of 3 backward passes each" in ev, ev
    assert "divided by 9 in all" in ev and "by 3 again" in ev, ev
    assert "steps once every 9 micro-batches" in ev, ev
    assert "gradient_accumulation_steps=1" in errors[0]["fix"], errors[0]
    assert not [f for f in findings if f["cls"] == "EXTRA_SYNC"], findings


@pytest.mark.parametrize("mode", ["once", "two_losses"])
def test_correct_twins_have_no_error(runs: dict[str, Watched], mode: str) -> None:
    code, findings, _, proc = runs[mode]
    assert "trained" in proc.stdout
    assert code == 0 and not [f for f in findings if f["severity"] == "error"], findings
