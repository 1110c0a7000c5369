"""DDP trainer class with two optimizers (AdamW for the encoder, SGD for the head), a DataLoader
worker, K = 2 with no_sync on the non-final micro-batches, and a stop/resume halfway through:
the state goes to disk and training continues in brand-new Trainer objects."""
import hashlib
import os
import tempfile
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CONFIG = dict(accum=2, micro=6, updates_per_epoch=4, epochs=2, seed=3, lr_enc=2e-3, lr_head=5e-2)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def dataset(cfg, world):
    g = torch.Generator().manual_seed(cfg["seed"] + 10)
    n = cfg["micro"] * cfg["accum"] * world * cfg["updates_per_epoch"]
    x = torch.randn(n, 12, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg["seed"])
        self.model = Model()
        self.ddp = DDP(self.model)
        self.opt_enc = torch.optim.AdamW(self.model.encoder.parameters(), lr=cfg["lr_enc"])
        self.opt_head = torch.optim.SGD(self.model.head.parameters(), lr=cfg["lr_head"],
                                        momentum=0.9)
        self.sampler = DistributedSampler(dataset(cfg, world), num_replicas=world, rank=rank,
                                          shuffle=True, seed=cfg["seed"])
        self.loader = DataLoader(dataset(cfg, world), batch_size=cfg["micro"],
                                 sampler=self.sampler, num_workers=1)
        self.epoch = 0

    def state_dict(self):
        return {"model": self.model.state_dict(), "opt_enc": self.opt_enc.state_dict(),
                "opt_head": self.opt_head.state_dict(), "epoch": self.epoch}

    def load_state_dict(self, sd):
        self.model.load_state_dict(sd["model"])
        self.opt_enc.load_state_dict(sd["opt_enc"])
        self.opt_head.load_state_dict(sd["opt_head"])
        self.epoch = sd["epoch"]

    def _optim_step(self):
        for opt in (self.opt_enc, self.opt_head):
            opt.step()
            opt.zero_grad(set_to_none=True)

    def run_epoch(self):
        self.sampler.set_epoch(self.epoch)
        k = self.cfg["accum"]
        for i, (x, y) in enumerate(self.loader):
            boundary = (i + 1) % k == 0
            with (nullcontext() if boundary else self.ddp.no_sync()):
                loss = F.cross_entropy(self.ddp(x), y) / k
                loss.backward()
            if boundary:
                self._optim_step()
        self.epoch += 1
        if self.rank == 0:
            print(f"epoch {self.epoch} last loss {loss.item() * k:.4f}", flush=True)


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_dir = os.path.join(tempfile.gettempdir(), f"a_c02_ckpt_{os.getppid()}")
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
    dist.barrier()
    path = os.path.join(ckpt_dir, "state.pt")

    first = Trainer(CONFIG, rank, world)
    first.run_epoch()
    if rank == 0:
        torch.save(first.state_dict(), path)
    dist.barrier()
    del first

    second = Trainer(CONFIG, rank, world)
    second.load_state_dict(torch.load(path, weights_only=False))
    while second.epoch < CONFIG["epochs"]:
        second.run_epoch()
    d = digest(second.model)
    dist.barrier()
    if rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
        os.remove(path)
        os.rmdir(ckpt_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
