"""Two-tower retrieval/CTR model on 2 DDP ranks. The item table was trained on an
older catalogue (48 items) and is grown to 64 rows before training (old rows kept,
new rows initialised at the mean); user features come from a frozen pretrained
projection. Micro-batches have different numbers of impressions on each rank; the
loss is a sum of per-impression BCE divided by the window's impression count over
all ranks, times the world size (DDP averages). Forwards run under bf16 autocast,
gradients are accumulated in fp32 with no_sync, and the window is clipped at 0.25."""
import hashlib
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CFG = SimpleNamespace(old_items=48, new_items=64, n_users=40, dim=16, accum=3, steps=8,
                      lr=1e-2, clip=0.25, seed=4)


class TwoTower(nn.Module):
    def __init__(self, n_items):
        super().__init__()
        self.user_proj = nn.Linear(8, CFG.dim)  # pretrained, frozen
        self.user_mlp = nn.Sequential(nn.Linear(CFG.dim, 32), nn.ReLU(), nn.Linear(32, CFG.dim))
        self.item_emb = nn.Embedding(n_items, CFG.dim)
        self.item_mlp = nn.Sequential(nn.Linear(CFG.dim, 32), nn.ReLU(), nn.Linear(32, CFG.dim))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, user_feats, items):
        u = self.user_mlp(self.user_proj(user_feats))
        v = self.item_mlp(self.item_emb(items))
        return (u * v).sum(-1) + self.bias


def grow_item_table(model, n_new):
    old = model.item_emb.weight.data
    emb = nn.Embedding(n_new, old.shape[1])
    with torch.no_grad():
        emb.weight[: old.shape[0]] = old
        emb.weight[old.shape[0]:] = old.mean(0, keepdim=True)
    model.item_emb = emb


def micro_batches(rank, n):
    g = torch.Generator().manual_seed(CFG.seed * 31 + rank)
    user_table = torch.randn(CFG.n_users, 8, generator=g)
    out = []
    for _ in range(n):
        b = int(torch.randint(3, 12, (1,), generator=g))
        users = torch.randint(0, CFG.n_users, (b,), generator=g)
        items = torch.randint(0, CFG.new_items, (b,), generator=g)
        label = ((users + items) % 3 == 0).float()
        out.append((user_table[users], items, label))
    return out


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(CFG.seed)

    model = TwoTower(CFG.old_items)
    grow_item_table(model, CFG.new_items)
    model.user_proj.requires_grad_(False)
    ddp = DDP(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=CFG.lr)

    data = micro_batches(rank, CFG.steps * CFG.accum)
    for step in range(CFG.steps):
        window = data[step * CFG.accum:(step + 1) * CFG.accum]
        n_imp = torch.tensor(float(sum(len(lbl) for _, _, lbl in window)))
        dist.all_reduce(n_imp)
        for k, (uf, items, label) in enumerate(window):
            last = k == len(window) - 1
            with (nullcontext() if last else ddp.no_sync()):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logit = ddp(uf, items)
                loss = F.binary_cross_entropy_with_logits(logit.float(), label, reduction="sum")
                (loss * world / n_imp).backward()
        torch.nn.utils.clip_grad_norm_(params, CFG.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
