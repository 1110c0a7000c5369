"""
Two-tower recommender (user tower / item tower, dot-product CTR), trained on 2 ranks
spawned by this script. No DDP: each rank accumulates K micro-batches, then one
flattened SUM all-reduce per optimizer step.

Loss of a window = sum of BCE over all *valid* impressions of the window on all ranks,
divided by that global impression count (sessions have 1-6 impressions, padded to 6).
The count is gathered before the window's first backward, so every micro-batch is
scaled by the same 1 / global_count and the summed gradient is the window mean.

The run is preempted after 6 updates: a checkpoint is written at the optimizer-step
boundary, every object is thrown away, rebuilt and reloaded, and the remaining 6
updates run from the next unseen micro-batch.

Model surgery done before training: the user table is grown from 40 to 56 rows for new
sign-ups (the old rows are kept), and the item-category embedding is frozen.
"""
import hashlib
import math
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset

PORT = 49208
SEED = 5
K = 2
MICRO_BS = 4
TOTAL_UPDATES = 12
PREEMPT_AT = 6
N_USERS_BASE, N_USERS = 40, 56
N_ITEMS, N_CATS, MAX_IMP, DIM = 64, 8, 6, 16


class ImpressionLog(Dataset):
    """Session i: a user, up to MAX_IMP shown items, click labels. Deterministic per index."""

    def __init__(self, n):
        self.n = n
        g = torch.Generator().manual_seed(SEED)
        self.item_cat = torch.randint(0, N_CATS, (N_ITEMS,), generator=g)
        self.u_pref = torch.randn(N_USERS, N_CATS, generator=g)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(SEED * 1000 + i)
        user = int(torch.randint(0, N_USERS, (1,), generator=g))
        n_imp = int(torch.randint(1, MAX_IMP + 1, (1,), generator=g))
        items = torch.randint(0, N_ITEMS, (MAX_IMP,), generator=g)
        p = torch.sigmoid(self.u_pref[user, self.item_cat[items]])
        clicks = (torch.rand(MAX_IMP, generator=g) < p).float()
        mask = torch.arange(MAX_IMP) < n_imp
        return {"user": torch.tensor(user), "items": items, "clicks": clicks, "mask": mask}


class TwoTower(nn.Module):
    def __init__(self, n_users, item_cat):
        super().__init__()
        self.user_emb = nn.Embedding(n_users, DIM)
        self.item_emb = nn.Embedding(N_ITEMS, DIM)
        self.cat_emb = nn.Embedding(N_CATS, DIM)
        self.register_buffer("item_cat", item_cat.clone())
        self.user_mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        self.item_mlp = nn.Sequential(nn.Linear(2 * DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, user, items):
        u = self.user_mlp(self.user_emb(user))                                   # (B, D)
        it = torch.cat([self.item_emb(items), self.cat_emb(self.item_cat[items])], -1)
        v = self.item_mlp(it)                                                    # (B, M, D)
        return (u.unsqueeze(1) * v).sum(-1) / math.sqrt(DIM) + self.bias        # (B, M)


def grow_user_table(model, new_rows):
    old = model.user_emb
    new = nn.Embedding(new_rows, old.embedding_dim)
    with torch.no_grad():
        new.weight.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(SEED + 99))
        new.weight[: old.num_embeddings] = old.weight
    model.user_emb = new
    return model


def build(ds):
    """Fresh objects: model (grown + partially frozen), optimizer, warm-up schedule."""
    torch.manual_seed(SEED)
    model = TwoTower(N_USERS_BASE, ds.item_cat)
    model = grow_user_table(model, N_USERS)
    model.cat_emb.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return model, params, opt, sched


def loader_from(ds, rank, world, start_micro):
    idx = list(range(rank, len(ds), world))[start_micro * MICRO_BS:]
    return DataLoader(Subset(ds, idx), batch_size=MICRO_BS, shuffle=False, num_workers=1)


def allreduce_sum_(params):
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    off = 0
    for g in grads:
        g.copy_(flat[off: off + g.numel()].view_as(g))
        off += g.numel()


def train(rank, world, ds, model, params, opt, sched, start_update, end_update):
    it = iter(loader_from(ds, rank, world, start_update * K))
    for update in range(start_update, end_update):
        window = [next(it) for _ in range(K)]
        count = torch.tensor(float(sum(int(b["mask"].sum()) for b in window)))
        dist.all_reduce(count)
        for b in window:
            logits = model(b["user"], b["items"])
            bce = F.binary_cross_entropy_with_logits(logits, b["clicks"], reduction="none")
            loss = (bce * b["mask"]).sum() / count
            loss.backward()
        allreduce_sum_(params)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=False)
        if rank == 0:
            print(f"update {update + 1}: impressions {int(count)} lr {sched.get_last_lr()[0]:.2e}", flush=True)


def worker(rank, world, ckpt_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=world)
    ds = ImpressionLog(n=200)

    model, params, opt, sched = build(ds)
    train(rank, world, ds, model, params, opt, sched, 0, PREEMPT_AT)
    ckpt = os.path.join(ckpt_dir, "ckpt.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "update": PREEMPT_AT}, ckpt)
    dist.barrier()
    del model, params, opt, sched

    # ---- resume into brand-new objects
    model, params, opt, sched = build(ds)
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    train(rank, world, ds, model, params, opt, sched, state["update"], TOTAL_UPDATES)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ckpt_dir = tempfile.mkdtemp(prefix="c_c02_")
    try:
        mp.spawn(worker, args=(2, ckpt_dir), nprocs=2, join=True)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
