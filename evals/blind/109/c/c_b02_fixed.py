"""Multi-task ranking model (click + watch time) trained with FSDP2 on 2 ranks.
Task losses are combined with learned homoscedastic uncertainty weights
(Kendall et al.); gradients are accumulated over ACCUM micro-batches with the
reduce-scatter deferred to the last micro-batch of each window."""
import argparse
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class TrainConfig:
    n_users: int = 64
    n_items: int = 96
    dim: int = 16
    micro_batch: int = 16
    accum: int = 4
    steps: int = 10
    lr: float = 2e-3
    seed: int = 11


class UncertaintyWeighting(nn.Module):
    """sum_t exp(-s_t) * L_t + s_t, with s_t = log sigma_t^2 learned."""

    def __init__(self, n_tasks):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n_tasks))

    def forward(self, losses):
        total = 0.0
        for i, l in enumerate(losses):
            total = total + torch.exp(-self.log_vars[i]) * l + self.log_vars[i]
        return total


class Tower(nn.Module):
    def __init__(self, d_in, d_hidden):
        super().__init__()
        self.l1 = nn.Linear(d_in, d_hidden)
        self.l2 = nn.Linear(d_hidden, d_hidden)

    def forward(self, x):
        return F.relu(self.l2(F.relu(self.l1(x))))


class Ranker(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.user_emb = nn.Embedding(cfg.n_users, cfg.dim)
        self.item_emb = nn.Embedding(cfg.n_items, cfg.dim)
        self.shared = Tower(2 * cfg.dim + 4, 32)
        self.click_head = nn.Linear(32, 1)
        self.watch_head = nn.Linear(32, 1)
        self.mtl = UncertaintyWeighting(2)

    def forward(self, users, items, dense):
        h = torch.cat([self.user_emb(users), self.item_emb(items), dense], dim=-1)
        h = self.shared(h)
        return self.click_head(h).squeeze(-1), self.watch_head(h).squeeze(-1)


def make_data(cfg, rank, n_micro):
    g = torch.Generator().manual_seed(cfg.seed * 100 + rank)
    n = n_micro * cfg.micro_batch
    users = torch.randint(0, cfg.n_users, (n,), generator=g)
    items = torch.randint(0, cfg.n_items, (n,), generator=g)
    dense = torch.randn(n, 4, generator=g)
    logit = 0.7 * dense[:, 0] - 0.5 * dense[:, 1] + 0.3 * torch.sin(items.float())
    click = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    watch = 2.0 + dense[:, 2] + 0.5 * torch.randn(n, generator=g)
    chunks = []
    for i in range(n_micro):
        s = slice(i * cfg.micro_batch, (i + 1) * cfg.micro_batch)
        chunks.append((users[s], items[s], dense[s], click[s], watch[s]))
    return chunks


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        model = Ranker(cfg)
        fully_shard(model.shared)
        fully_shard(model)
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        self.data = make_data(cfg, self.rank, cfg.steps * cfg.accum)

    def micro_step(self, batch, is_last):
        users, items, dense, click, watch = batch
        self.model.set_requires_gradient_sync(is_last)
        click_logit, watch_pred = self.model(users, items, dense)
        task_losses = [
            F.binary_cross_entropy_with_logits(click_logit, click),
            0.5 * F.mse_loss(watch_pred, watch),
        ]
        # weight the tasks, then scale the whole objective for accumulation
        loss = self.model.mtl(task_losses) / self.cfg.accum
        loss.backward()
        return loss.detach()

    def fit(self):
        it = iter(self.data)
        for step in range(self.cfg.steps):
            for k in range(self.cfg.accum):
                self.micro_step(next(it), is_last=(k == self.cfg.accum - 1))
            self.opt.step()
            self.opt.zero_grad()

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum", type=int, default=TrainConfig.accum)
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    cfg = TrainConfig(accum=args.accum, steps=args.steps)
    trainer = Trainer(cfg)
    trainer.fit()
    sha = trainer.final_sha()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
