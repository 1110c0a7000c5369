"""Multi-task regression + classification on a DeepSpeed ZeRO-2 engine.

Task weighting follows Kendall et al. (homoscedastic uncertainty): one learned
log-variance per task. Gradient accumulation is handled by the engine.
"""
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RunConfig:
    seed: int = 1234
    d_in: int = 24
    hidden: int = 64
    n_classes: int = 5
    micro_bs: int = 8
    grad_accum: int = 4
    n_optimizer_steps: int = 12
    lr: float = 3e-3
    uw_lr: float = 1e-2


class MultiTaskNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(cfg.d_in, cfg.hidden), nn.GELU(),
                                   nn.Linear(cfg.hidden, cfg.hidden), nn.GELU())
        self.reg_head = nn.Linear(cfg.hidden, 1)
        self.cls_head = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, x):
        h = self.trunk(x)
        return self.reg_head(h).squeeze(-1), self.cls_head(h)


class UncertaintyWeights(nn.Module):
    def __init__(self, n_tasks):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n_tasks))

    def forward(self, losses):
        total = 0.0
        for i, l in enumerate(losses):
            total = total + torch.exp(-self.log_vars[i]) * l + self.log_vars[i]
        return total


def make_batches(cfg, rank, world):
    g = torch.Generator().manual_seed(cfg.seed + 17)
    n = cfg.n_optimizer_steps * cfg.grad_accum * world * cfg.micro_bs
    x = torch.randn(n, cfg.d_in, generator=g)
    w = torch.randn(cfg.d_in, generator=g)
    y_reg = x @ w * 0.7 + 0.3 * torch.randn(n, generator=g)
    y_cls = (x[:, :cfg.n_classes] * 2 + torch.randn(n, cfg.n_classes, generator=g)).argmax(-1)
    x, y_reg, y_cls = x[rank::world], y_reg[rank::world], y_cls[rank::world]
    for i in range(0, x.shape[0], cfg.micro_bs):
        yield x[i:i + cfg.micro_bs], y_reg[i:i + cfg.micro_bs], y_cls[i:i + cfg.micro_bs]


class MultiTaskTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = MultiTaskNet(cfg)
        self.weighting = UncertaintyWeights(2)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_bs,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": 0.01,
                                                       "torch_adam": True}},
            "zero_optimization": {"stage": 2},
            "steps_per_print": 10_000,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=ds_config)
        # the weighting has a different learning rate and no weight decay
        self.uw_opt = torch.optim.SGD(self.weighting.parameters(), lr=cfg.uw_lr)

    def compute_loss(self, xb, yr, yc):
        pred_r, logits = self.engine(xb)
        return self.weighting([F.mse_loss(pred_r, yr), F.cross_entropy(logits, yc)])

    def weighting_step(self):
        for p in self.weighting.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        self.uw_opt.step()
        self.uw_opt.zero_grad(set_to_none=True)

    def train(self):
        self.engine.train()
        for xb, yr, yc in make_batches(self.cfg, self.rank, self.world):
            loss = self.compute_loss(xb, yr, yc)
            self.engine.backward(loss)
            boundary = self.engine.is_gradient_accumulation_boundary()
            self.engine.step()
            if boundary:
                self.weighting_step()

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        for _, p in self.weighting.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    trainer = MultiTaskTrainer(RunConfig())
    trainer.train()
    digest = trainer.final_digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
