# corpus: style=fsdp class=F10
# an FSDP trainer normalises the summed token loss by a global batch that includes the world
# size; FSDP averages the gradients over the ranks as well: G / W
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


@dataclass
class Config:
    micro_bsz: int = 8
    grad_accum: int = 4
    lr: float = 1e-4


class Trainer:
    def __init__(self, model, loader, cfg: Config):
        self.model = FSDP(model)
        self.loader = loader
        self.cfg = cfg
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.global_bsz = cfg.micro_bsz * cfg.grad_accum * dist.get_world_size()

    def train_epoch(self):
        for i, (x, y) in enumerate(self.loader):
            per_sample = torch.nn.functional.mse_loss(self.model(x), y, reduction="none").sum(-1)
            loss = per_sample.sum() / self.global_bsz  # expect: AG112
            loss.backward()
            if (i + 1) % self.cfg.grad_accum == 0:  # expect: AG117
                self.opt.step()
                self.opt.zero_grad()
