"""REINFORCE-with-baseline policy on spawned ranks, data parallel by hand.

No DDP wrapper: every parameter has a post-accumulate-grad hook that launches an
async SUM all-reduce, but only while the window's last micro-batch is being
backpropagated; handles are waited on before the step. Each rank's rollout
buffer holds 8 micro-batches, so with K = 3 the windows are 3-3-2; every
window's loss is a sum over its samples divided by the window's all-ranks
sample count. Trains 2 passes, checkpoints, rebuilds everything from disk and
trains a third pass.
"""
import hashlib
import os
import tempfile

import torch
import torch.nn as nn
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
PORT = 49243
K = 3
MICRO = 6
N_MICRO = 8
OBS, ACT = 6, 3


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS, 32), nn.Tanh())
        self.pi = nn.Linear(32, ACT)
        self.v = nn.Linear(32, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class HandSync:
    def __init__(self, model):
        self.active = False
        self.handles = []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        if self.active:
            self.handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))

    def finish(self):
        for h in self.handles:
            h.wait()
        self.handles.clear()
        self.active = False


def rollout(rank, pass_idx):
    g = torch.Generator().manual_seed(500 + 17 * rank + pass_idx)
    obs = torch.randn(N_MICRO, MICRO, OBS, generator=g)
    act = torch.randint(0, ACT, (N_MICRO, MICRO), generator=g)
    ret = (obs[..., 0] * (act.float() - 1.0)) + 0.2 * torch.randn(N_MICRO, MICRO, generator=g)
    return obs, act, ret


def pg_loss_sum(model, obs, act, ret):
    logits, v = model(obs)
    logp = torch.log_softmax(logits, -1).gather(-1, act[..., None]).squeeze(-1)
    adv = (ret - v).detach()
    return -(logp * adv).sum() + 0.5 * ((v - ret) ** 2).sum()


def build():
    torch.manual_seed(8)
    model = Policy()
    opt = torch.optim.Adam([
        {"params": list(model.trunk.parameters()) + list(model.pi.parameters()), "lr": 3e-3},
        {"params": model.v.parameters(), "lr": 1e-2},
    ])
    return model, opt


def train_pass(rank, model, opt, sync, pass_idx):
    obs, act, ret = rollout(rank, pass_idx)
    for start in range(0, N_MICRO, K):
        idx = list(range(start, min(start + K, N_MICRO)))
        n_all = torch.tensor(float(len(idx) * MICRO))
        dist.all_reduce(n_all)
        for j, m in enumerate(idx):
            sync.active = j == len(idx) - 1
            loss = pg_loss_sum(model, obs[m], act[m], ret[m]) / n_all
            loss.backward()
        sync.finish()
        opt.step()
        opt.zero_grad(set_to_none=True)


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, ckpt_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model, opt = build()
    sync = HandSync(model)
    for pass_idx in range(2):
        train_pass(rank, model, opt, sync, pass_idx)
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "pass": 2}, path)
    dist.barrier()
    del model, opt, sync

    model, opt = build()
    sync = HandSync(model)
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    for pass_idx in range(state["pass"], 3):
        train_pass(rank, model, opt, sync, pass_idx)

    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", params_sha(model), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(d,), nprocs=WORLD, join=True)
