"""Multi-task CTR / CVR recommender (shared-bottom, ESMM-like heads) on 2 spawned DDP ranks.

CTR is learned on every impression, CVR on clicked impressions only. Each optimizer step
covers a window of `accum_steps` micro-batches per rank; the micro-batches are uneven (the
epoch's last one is short), so the CTR term is normalised by the window's impression count
over all ranks. Embeddings use Adagrad, the dense part AdamW.
"""
import hashlib
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@dataclass
class Config:
    world_size: int = 2
    port: int = 49206
    seed: int = 7
    n_users: int = 200
    n_items: int = 300
    n_dense: int = 8
    emb_dim: int = 16
    n_samples: int = 120
    micro_batch: int = 8
    accum_steps: int = 4
    epochs: int = 6
    lr_dense: float = 3e-3
    lr_emb: float = 5e-2
    cvr_weight: float = 1.0
    num_workers: int = 1


class Impressions(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        n = cfg.n_samples
        self.user = torch.randint(0, cfg.n_users, (n,), generator=g)
        self.item = torch.randint(0, cfg.n_items, (n,), generator=g)
        self.dense = torch.randn(n, cfg.n_dense, generator=g)
        ctr_score = self.dense[:, 0] + 0.5 * self.dense[:, 1] - 0.6
        self.click = (torch.rand(n, generator=g) < torch.sigmoid(ctr_score)).float()
        cvr_score = self.dense[:, 2] - 0.3 * self.dense[:, 3]
        self.conv = self.click * (torch.rand(n, generator=g) < torch.sigmoid(cvr_score)).float()

    def __len__(self):
        return len(self.user)

    def __getitem__(self, i):
        return {"user": self.user[i], "item": self.item[i], "dense": self.dense[i],
                "click": self.click[i], "conv": self.conv[i]}


class SharedBottom(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.user_emb = nn.Embedding(cfg.n_users, cfg.emb_dim)
        self.item_emb = nn.Embedding(cfg.n_items, cfg.emb_dim)
        d_in = 2 * cfg.emb_dim + cfg.n_dense
        self.bottom = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.ctr_tower = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))
        self.cvr_tower = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user, item, dense):
        h = torch.cat([self.user_emb(user), self.item_emb(item), dense], dim=-1)
        h = self.bottom(h)
        return self.ctr_tower(h).squeeze(-1), self.cvr_tower(h).squeeze(-1)


class MultiTaskTrainer:
    def __init__(self, cfg, rank):
        self.cfg, self.rank = cfg, rank
        torch.manual_seed(cfg.seed)
        net = SharedBottom(cfg)
        self.model = DDP(net)
        emb = [net.user_emb.weight, net.item_emb.weight]
        dense = [p for n, p in net.named_parameters() if not n.endswith("_emb.weight")]
        self.opt_emb = torch.optim.Adagrad(emb, lr=cfg.lr_emb)
        self.opt_dense = torch.optim.AdamW(dense, lr=cfg.lr_dense, weight_decay=1e-4)
        ds = Impressions(cfg)
        self.sampler = DistributedSampler(ds, num_replicas=cfg.world_size, rank=rank, shuffle=True, seed=cfg.seed)
        self.loader = DataLoader(ds, batch_size=cfg.micro_batch, sampler=self.sampler,
                                 num_workers=cfg.num_workers, persistent_workers=True, drop_last=False)
        self.global_step = 0

    # -- helpers -------------------------------------------------------------
    def windows(self):
        window = []
        for batch in self.loader:
            window.append(batch)
            if len(window) == self.cfg.accum_steps:
                yield window
                window = []
        if window:
            yield window

    def window_impressions(self, window):
        n = torch.tensor([float(sum(len(b["click"]) for b in window)),
                          float(sum(b["click"].sum().item() for b in window))])
        dist.all_reduce(n)
        return n[0], n[1]

    def zero_grad(self):
        self.opt_emb.zero_grad(set_to_none=True)
        self.opt_dense.zero_grad(set_to_none=True)

    def step(self):
        self.opt_emb.step()
        self.opt_dense.step()
        self.zero_grad()
        self.global_step += 1

    def micro_step(self, batch, n_imp, n_clk, sync):
        cfg = self.cfg
        ctx = nullcontext() if sync else self.model.no_sync()
        with ctx:
            ctr_logit, cvr_logit = self.model(batch["user"], batch["item"], batch["dense"])
            # CTR over every impression of the window, all ranks; DDP averages, so x world size
            ctr_loss = F.binary_cross_entropy_with_logits(ctr_logit, batch["click"], reduction="sum")
            ctr_loss = ctr_loss * cfg.world_size / n_imp
            clicked = batch["click"] > 0
            if clicked.any():
                cvr_loss = F.binary_cross_entropy_with_logits(cvr_logit[clicked], batch["conv"][clicked], reduction="sum")
                cvr_loss = cvr_loss * cfg.world_size / n_clk
            else:
                cvr_loss = cvr_logit.sum() * 0.0
            loss = ctr_loss + cfg.cvr_weight * cvr_loss
            loss.backward()
        return loss.detach()

    # -- main loop -----------------------------------------------------------
    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.model.train()
            self.sampler.set_epoch(epoch)
            for window in self.windows():
                n_imp, n_clk = self.window_impressions(window)
                for j, batch in enumerate(window):
                    loss = self.micro_step(batch, n_imp, n_clk, sync=(j == len(window) - 1))
                self.step()
            if self.rank == 0:
                print(f"epoch {epoch} step {self.global_step} last loss {loss.item():.4f}")


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.set_num_threads(1)
    trainer = MultiTaskTrainer(cfg, rank)
    trainer.fit()
    if rank == 0:
        print("FINAL_SHA256", params_sha256(trainer.model.module))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = Config()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
