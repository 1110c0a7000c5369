"""CTR model (user/item embeddings + frozen item-text projection + MLP) on FSDP2.

Ranks get different micro-batch sizes (6 and 10 impressions); the BCE is summed
and normalised by the window's impression count over all ranks (x world size,
since FSDP averages). K = 2. The run is checkpointed after 6 updates (per-rank
sharded state of model, optimizer and scheduler), torn down and resumed into
freshly built objects for the remaining updates.
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

N_USERS, N_ITEMS, TEXT_DIM, D = 40, 60, 24, 16
K = 2
TOTAL_UPDATES = 12
RESUME_AT = 6
LR = 2e-3
CKPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c02_ckpt")


class CTRModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(N_USERS, D)
        self.item = nn.Embedding(N_ITEMS, D)
        self.text_proj = nn.Linear(TEXT_DIM, D)  # "pretrained", kept frozen
        self.tower = nn.Sequential(nn.Linear(3 * D, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.out = nn.Linear(16, 1)

    def forward(self, u, i, text):
        z = torch.cat([self.user(u), self.item(i), self.text_proj(text)], -1)
        return self.out(self.tower(z)).squeeze(-1)


def build(rank):
    torch.manual_seed(11)
    model = CTRModel()
    model.text_proj.requires_grad_(False)
    fully_shard(model.tower)
    fully_shard(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.01)
    warm = 2
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, TOTAL_UPDATES) / TOTAL_UPDATES)))
    return model, opt, sched


def micro_batches(rank):
    g = torch.Generator().manual_seed(77 + rank)
    text_table = torch.randn(N_ITEMS, TEXT_DIM, generator=torch.Generator().manual_seed(5))
    bs = 6 if rank == 0 else 10
    out = []
    for _ in range(TOTAL_UPDATES * K):
        u = torch.randint(0, N_USERS, (bs,), generator=g)
        i = torch.randint(0, N_ITEMS, (bs,), generator=g)
        y = ((u * 3 + i) % 5 < 2).float()
        out.append((u, i, text_table[i], y))
    return out


def train(model, opt, sched, data, start, stop, world):
    for upd in range(start, stop):
        win = data[upd * K:(upd + 1) * K]
        n = torch.tensor(float(sum(b[3].numel() for b in win)))
        dist.all_reduce(n)
        for j, (u, i, text, y) in enumerate(win):
            model.set_requires_gradient_sync(j == K - 1)
            logits = model(u, i, text)
            loss = F.binary_cross_entropy_with_logits(logits, y, reduction="sum") * world / n
            loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = micro_batches(rank)
    os.makedirs(CKPT_DIR, exist_ok=True)
    path = os.path.join(CKPT_DIR, f"rank{rank}.pt")

    model, opt, sched = build(rank)
    train(model, opt, sched, data, 0, RESUME_AT, world)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "update": RESUME_AT}, path)
    del model, opt, sched
    dist.barrier()

    # "preempted": new process objects, resume from the sharded checkpoint
    model, opt, sched = build(rank)
    ck = torch.load(path, weights_only=False)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    train(model, opt, sched, data, ck["update"], TOTAL_UPDATES, world)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor()
        h.update(full.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"lr at end {sched.get_last_lr()[0]:.2e}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
