"""GRPO on two spawned DDP ranks, interrupted and resumed into rebuilt objects.

* policy in DDP, frozen reference kept outside it;
* each rollout gives 5 micro-batches per rank and K = 2, so windows are 2-2-1;
  every window is normalised by its own all-ranks completion-token count (x W,
  since DDP averages);
* a global-norm clip at 0.5 (it acts) before each step;
* after rollout 2 the run saves a checkpoint at a window boundary, tears
  everything down, rebuilds policy/optimizer/scheduler and resumes.
"""
import copy
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49207
VOCAB, DIM, PLEN, CLEN, G = 24, 32, 5, 8, 4
ROLLOUTS, MB_PER_ROLLOUT, K, STOP_AFTER = 5, 5, 2, 2
LR, BETA, CLIP = 3e-3, 0.05, 0.5


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Conv1d(DIM, DIM, 3, padding=2)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.tok(ids).transpose(1, 2)
        x = torch.tanh(self.mix(x)[..., : ids.shape[1]]).transpose(1, 2)
        return self.out(x)


def logps(model, ids):
    lp = torch.log_softmax(model(ids[:, :-1]), -1)
    return lp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def micro_batch(rollout, j, rank):
    g = torch.Generator().manual_seed(7919 * rollout + 31 * j + rank)
    prompts = torch.randint(0, VOCAB, (2, PLEN), generator=g).repeat_interleave(G, 0)
    comp = torch.randint(0, VOCAB, (2 * G, CLEN), generator=g)
    lens = torch.randint(1, CLEN + 1, (2 * G,), generator=g)
    m = (torch.arange(CLEN)[None] < lens[:, None]).float()
    rew = ((comp % 3 == 0).float() * m).sum(1) / lens + 0.05 * torch.randn(2 * G, generator=g)
    r = rew.view(2, G)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    mask = torch.cat([torch.zeros(2 * G, PLEN - 1), m], 1)
    return torch.cat([prompts, comp], 1), mask, adv


def build(rank):
    torch.manual_seed(3)
    net = Policy()
    ref = copy.deepcopy(net).requires_grad_(False)
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return model, ref, opt, sched


def train_rollouts(model, ref, opt, sched, start, stop, rank, W):
    for rollout in range(start, stop):
        mbs = [micro_batch(rollout, j, rank) for j in range(MB_PER_ROLLOUT)]
        windows = [mbs[s:s + K] for s in range(0, len(mbs), K)]
        for win in windows:
            cnt = torch.tensor(float(sum(m.sum() for _, m, _ in win)))
            dist.all_reduce(cnt)
            for k, (ids, mask, adv) in enumerate(win):
                last = k == len(win) - 1
                model.require_backward_grad_sync = last
                lp = logps(model, ids)
                with torch.no_grad():
                    rlp = logps(ref, ids)
                ratio = torch.exp(lp - lp.detach())
                kl = torch.exp(rlp - lp) - (rlp - lp) - 1
                tok = -ratio * adv[:, None] + BETA * kl
                ((tok * mask).sum() * W / cnt).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)


def worker(rank, W, ckpt):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=W)
    torch.use_deterministic_algorithms(True)

    model, ref, opt, sched = build(rank)
    train_rollouts(model, ref, opt, sched, 0, STOP_AFTER, rank, W)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "ref": ref.state_dict(), "rollout": STOP_AFTER}, ckpt)
    dist.barrier()
    del model, opt, sched

    model, ref, opt, sched = build(rank)
    state = torch.load(ckpt, weights_only=False)
    model.module.load_state_dict(state["model"])
    ref.load_state_dict(state["ref"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    train_rollouts(model, ref, opt, sched, state["rollout"], ROLLOUTS, rank, W)

    if rank == 0:
        h = hashlib.sha256()
        flat = []
        for _, p in model.module.named_parameters():
            t = p.detach().float().contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat(flat), os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, os.path.join(d, "ckpt.pt")), nprocs=2, join=True)
