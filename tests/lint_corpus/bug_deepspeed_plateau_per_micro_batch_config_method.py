# corpus: style=deepspeed class=F4
"""A DeepSpeed trainer whose config a dataclass method writes from its own fields (GA 4),
with a ReduceLROnPlateau held under a name that does not say "sched", stepped after every
engine.step(): the plateau's patience counts micro-batches (blind round 124 a_b02)."""
from dataclasses import dataclass

import deepspeed
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import ReduceLROnPlateau


@dataclass
class TrainConfig:
    micro_batch: int = 8
    grad_accum: int = 4
    lr: float = 1e-3

    def deepspeed_config(self):
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "gradient_clipping": 0.0,
        }


class ZeroTrainer:
    def __init__(self, cfg, model, loader):
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                                    config=cfg.deepspeed_config())
        self.plateau = ReduceLROnPlateau(opt, patience=2)
        self.loader = loader

    def train(self):
        for x, y in self.loader:
            loss = F.mse_loss(self.engine(x), y)
            self.engine.backward(loss)
            self.engine.step()
            self.plateau.step(loss.item())  # expect: AG103


def main(model, loader):
    ZeroTrainer(TrainConfig(), model, loader).train()
