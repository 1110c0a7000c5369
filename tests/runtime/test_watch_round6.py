"""Blind evaluation round 6 findings, as classes, under the real ``accumguard watch`` CLI
on unmodified scripts (no ``-k``): a loss never divided by K (LOSS_SCALE, plain loop and
trainer class, one rank and DDP), a hand-written all_reduce(SUM) after DDP's synced
backward (F10, plain SGD and ZeroRedundancyOptimizer), an epoch tail cleared by the next
epoch's zero_grad (one F7 warning saying "dropped": each step is a whole window, only data
was skipped), an actor and a critic with two optimizers
(K = 4, not 8), bf16 gradients summed over K backwards (F12), a DDP model rebuilt after a
checkpoint (no false "extra reductions" note). Each buggy form has a correct twin that
must stay silent (no error).

The cases of each test run in one launch (tests/watch_sweep.py: one ``python``, one
``torchrun``), each recorded as ``watch`` records it and judged by the function the CLI
calls; tests/runtime/test_watch.py launches the real CLI."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from test_watch import _errors
from watch_sweep import Watched, watch_many

from helpers import free_port

LOCAL = textwrap.dedent('''
    """One-process loops, one per mode (argv[1])."""
    import sys

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    K = 4
    MODE = sys.argv[1]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)


    def batch(n=6):
        x = torch.randn(n, 8, generator=gen)
        return x, torch.randint(0, 3, (n,), generator=gen)


    def make(dtype=torch.float32):
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


    class Trainer:  # the trainer-class style: the loss is never divided by K
        def __init__(self):
            self.model = make()
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

        def fit(self, steps):
            for _ in range(steps):
                for _ in range(K):
                    x, y = batch()
                    self.model(x)  # a side forward (logging) does not change the rule
                    loss = nn.CrossEntropyLoss()(self.model(x), y)
                    loss.backward()
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)


    if MODE == "notdiv_class":
        Trainer().fit(3)
    elif MODE in ("notdiv_loop", "notdiv_gradiv", "div"):
        net = make()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        for step in range(3):
            for micro in range(K):
                x, y = batch()
                loss = F.mse_loss(net(x), F.one_hot(y, 3).float())
                (loss / K if MODE == "div" else loss).backward()
            if MODE == "notdiv_gradiv":  # correct: the sum divided by K by hand
                for p in net.parameters():
                    p.grad.div_(K)
            opt.step()
            opt.zero_grad()
    elif MODE in ("epoch_drop", "epoch_flush"):
        net = make()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        data = [batch() for _ in range(10)]
        loader = torch.utils.data.DataLoader(data, batch_size=None)
        for epoch in range(2):
            opt.zero_grad()
            for i, (x, y) in enumerate(loader):
                last = i == len(data) - 1
                div = 2 if (MODE == "epoch_flush" and i >= 8) else K
                (F.cross_entropy(net(x), y) / div).backward()
                if (i + 1) % K == 0 or (MODE == "epoch_flush" and last):
                    opt.step()
                    opt.zero_grad()
    elif MODE == "actor_critic":
        actor, critic = make(), nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        opt_a = torch.optim.Adam(actor.parameters(), lr=3e-4)
        opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
        for update in range(4):
            for chunk in range(K):
                x, a = batch(16)
                ret = x[:, :1] * 0.5
                values = critic(x)
                adv = (ret - values).detach().squeeze(1)
                logp = torch.log_softmax(actor(x), -1).gather(1, a[:, None]).squeeze(1)
                (-(logp * adv).mean() / K).backward()
                (0.5 * (ret - values).pow(2).mean() / K).backward()
            opt_a.step()
            opt_c.step()
            opt_a.zero_grad()
            opt_c.zero_grad()
    elif MODE in ("bf16_long", "bf16_buffer"):
        KB = 8  # more micro-steps, as a long-accumulation bf16 loop has
        net = make(torch.bfloat16)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        bufs = [torch.zeros_like(p, dtype=torch.float32) for p in net.parameters()]
        for step in range(3):
            for micro in range(KB):
                x, y = batch()
                (F.cross_entropy(net(x.bfloat16()).float(), y) / KB).backward()
                if MODE == "bf16_buffer":  # correct: summed in fp32 buffers
                    for b, p in zip(bufs, net.parameters()):
                        b.add_(p.grad.float())
                        p.grad = None
            if MODE == "bf16_buffer":
                for b, p in zip(bufs, net.parameters()):
                    p.grad = b.to(torch.bfloat16)
                    b.zero_()
            opt.step()
            opt.zero_grad()
    print("trained")
''')

DDP = textwrap.dedent('''
    """DDP loops on 2 gloo ranks, one per mode (argv[1])."""
    import contextlib
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    accumulation_steps = 4
    MODE = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(3 + rank)


    def build():
        torch.manual_seed(0)
        # module= by keyword, as Lightning's DDP strategy builds it
        model = DDP(module=nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
        if MODE == "zero_sum":
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                          lr=0.02)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.02)
        return model, opt


    model, opt = build()
    for step in range(5):
        if MODE == "rebuild" and step == 3:  # resume from a checkpoint: a fresh DDP
            state = model.module.state_dict()
            del model, opt
            model, opt = build()
            model.module.load_state_dict(state)
        for k in range(accumulation_steps):
            last = k == accumulation_steps - 1
            with (contextlib.nullcontext() if last else model.no_sync()):
                x = torch.randn(6, 8, generator=gen)
                loss = F.mse_loss(model(x), x[:, :1] * 2)
                (loss if MODE == "notdiv" else loss / accumulation_steps).backward()
        if MODE in ("sum", "zero_sum", "avg", "double_avg"):
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                if MODE == "avg":
                    p.grad.div_(world)  # redundant, but correct
                elif MODE == "double_avg":
                    p.grad.div_(world * world)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("trained")
''')


LOCAL_CASES = [
    ("notdiv_loop", {"LOSS_SCALE"}), ("notdiv_class", {"LOSS_SCALE"}),
    ("notdiv_gradiv", set()), ("div", set()),
    ("epoch_drop", set()), ("epoch_flush", set()),
    ("actor_critic", set()),
    ("bf16_long", {"F12"}), ("bf16_buffer", set()),
]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    tmp = tmp_path_factory.mktemp("round6_local")
    script = tmp / "train6.py"
    script.write_text(LOCAL)
    return watch_many(tmp / "runs", {mode: [sys.executable, str(script), mode]
                                     for mode, _ in LOCAL_CASES})


@pytest.mark.parametrize(("mode", "expected"), LOCAL_CASES)
def test_round6_local(local: dict[str, Watched], mode: str, expected: set[str]) -> None:
    code, findings, report, proc = local[mode]
    assert proc.stdout.strip() == "trained", proc.stderr[-2000:]
    assert _errors(findings) == expected, findings
    assert code == (1 if expected else 0)
    if "LOSS_SCALE" in expected:
        f = next(f for f in findings if f["cls"] == "LOSS_SCALE")
        assert "not divided by K" in f["evidence"] and "K x G" in f["evidence"], f
        assert "train6.py:" in f["evidence"]
    if mode == "epoch_drop":  # one F7 warning (data skipped, each step right), no F3
        assert [(f["cls"], f["severity"]) for f in findings
                if f["severity"] != "note"] == [("F7", "warning")], findings
        assert "dropped" in findings[0]["title"] and "leaked into" not in findings[0]["evidence"]
    if mode == "actor_critic":
        assert report["accumulation_steps"] == 4, report["accumulation_steps_source"]
    f12 = [f for f in findings if f["cls"] == "F12"]
    if mode == "bf16_long":  # K = 8 summed in bf16: an error (K >= 4) with the drift
        assert [f["severity"] for f in f12] == ["error"], findings
        assert "u*sqrt(K)/3" in f12[0]["evidence"] and "master_weights=True" in f12[0]["fix"]
    else:
        assert not f12, findings


def _torchrun(script: Path, mode: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), mode]


DDP_CASES = [
    ("notdiv", {"LOSS_SCALE"}), ("div", set()),
    ("sum", {"F10"}), ("zero_sum", {"F10"}), ("double_avg", {"F10"}), ("avg", set()),
    ("rebuild", set()),
]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    tmp = tmp_path_factory.mktemp("round6_ddp")
    script = tmp / "ddp6.py"
    script.write_text(DDP)
    return watch_many(tmp / "runs", {mode: _torchrun(script, mode) for mode, _ in DDP_CASES})


@pytest.mark.parametrize(("mode", "expected"), DDP_CASES)
def test_round6_ddp(ddp: dict[str, Watched], mode: str, expected: set[str]) -> None:
    code, findings, report, proc = ddp[mode]
    assert "trained" in proc.stdout, proc.stderr[-3000:]
    assert report["ranks"] == [0, 1]
    assert _errors(findings) == expected, findings
    assert code == (1 if expected else 0)
    if mode in ("sum", "zero_sum", "double_avg"):
        f = next(f for f in findings if f["cls"] == "F10")
        assert ("2x too large" if mode != "double_avg" else "2x too small") in f["evidence"]
    if mode == "avg":  # a redundant all-reduce: a note with the count, never an error
        assert any(f["severity"] == "note" and "more gradient collective" in f["evidence"]
                   for f in findings), findings
    if mode in ("rebuild", "div"):
        assert not [f for f in findings if "extra gradient reduction" in f["evidence"]], \
            findings
