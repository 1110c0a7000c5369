"""Multi-task trainer (regression + classification) on 2 DDP ranks.

Shared encoder on a frozen pretrained-style embedding table, two task heads.
The encoder and the heads have separate optimizers and schedulers; a worker
DataLoader with a DistributedSampler feeds equal-size micro-batches.
"""
import contextlib
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class Config:
    n_items: int = 192
    vocab: int = 50
    seq: int = 10
    dim: int = 32
    n_classes: int = 5
    micro_bs: int = 8
    accum: int = 3
    epochs: int = 3
    enc_lr: float = 2e-3
    head_lr: float = 5e-2
    reg_weight: float = 0.5
    seed: int = 3


class TaskData(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        self.x = torch.randint(0, cfg.vocab, (cfg.n_items, cfg.seq), generator=g)
        key = torch.randn(cfg.vocab, generator=g)
        s = key[self.x].mean(1)
        self.y_reg = s + 0.1 * torch.randn(cfg.n_items, generator=g)
        self.y_cls = torch.bucketize(s, torch.linspace(-0.4, 0.4, cfg.n_classes - 1))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y_reg[i], self.y_cls[i]


class MultiTaskNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.embed.weight.requires_grad_(False)  # frozen table
        self.encoder = nn.Sequential(nn.Linear(cfg.dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.reg_head = nn.Linear(64, 1)
        self.cls_head = nn.Linear(64, cfg.n_classes)

    def forward(self, x):
        h = self.encoder(self.embed(x).mean(1))
        return self.reg_head(h).squeeze(-1), self.cls_head(h)


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        self.net = MultiTaskNet(cfg)
        self.model = DDP(self.net)
        self.enc_opt = torch.optim.AdamW(self.net.encoder.parameters(), lr=cfg.enc_lr)
        self.head_opt = torch.optim.SGD(list(self.net.reg_head.parameters()) + list(self.net.cls_head.parameters()),
                                        lr=cfg.head_lr, momentum=0.9)
        self.enc_sched = torch.optim.lr_scheduler.StepLR(self.enc_opt, step_size=4, gamma=0.5)
        self.head_sched = torch.optim.lr_scheduler.LinearLR(self.head_opt, start_factor=1.0, end_factor=0.2, total_iters=12)
        ds = TaskData(cfg)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(ds, batch_size=cfg.micro_bs, sampler=self.sampler, num_workers=1,
                                 drop_last=True, persistent_workers=True)
        self.opt_steps = 0

    def compute_loss(self, batch):
        x, y_reg, y_cls = batch
        pred_reg, logits = self.model(x)
        return F.cross_entropy(logits, y_cls) + self.cfg.reg_weight * F.mse_loss(pred_reg, y_reg)

    def optimizer_step(self):
        for opt in (self.enc_opt, self.head_opt):
            opt.step()
        for sch in (self.enc_sched, self.head_sched):
            sch.step()
        for opt in (self.enc_opt, self.head_opt):
            opt.zero_grad(set_to_none=True)
        self.opt_steps += 1

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        K = self.cfg.accum
        n = len(self.loader)
        assert n % K == 0
        for i, batch in enumerate(self.loader):
            last = (i + 1) % K == 0
            with (contextlib.nullcontext() if last else self.model.no_sync()):
                loss = self.compute_loss(batch) / K
                loss.backward()
            if last:
                self.optimizer_step()
        return loss.item() * K

    def fit(self):
        for epoch in range(self.cfg.epochs):
            loss = self.train_epoch(epoch)
            if self.rank == 0:
                print(f"epoch {epoch} steps {self.opt_steps} loss {loss:.4f}")
        if self.rank == 0:
            print("FINAL_SHA256", final_sha(self.net))


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    Trainer(Config()).fit()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
