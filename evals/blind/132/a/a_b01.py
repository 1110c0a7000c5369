"""ZeRO-1 trainer for a tiny tagger; step-decay LR once per epoch.

The schedule is a plain torch StepLR handed to the DeepSpeed engine, which
steps it for us together with the optimizer.
"""
import hashlib
import os
from dataclasses import dataclass, field

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class TrainConfig:
    vocab: int = 48
    dim: int = 32
    n_tags: int = 7
    seq_len: int = 12
    samples: int = 48          # total, split across the ranks
    micro_batch: int = 4
    grad_accum: int = 3
    epochs: int = 5
    lr: float = 3e-3
    lr_decay: float = 0.3      # multiply LR by this after every epoch
    weight_decay: float = 0.01
    seed: int = 1234
    ds_extra: dict = field(default_factory=dict)


class Tagger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.mix = nn.Linear(cfg.dim, cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.n_tags)

    def forward(self, tokens, tags):
        h = torch.tanh(self.mix(self.emb(tokens)))
        logits = self.out(h)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tags.reshape(-1))


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.vocab, (cfg.samples, cfg.seq_len), generator=g)
    tags = (tokens * 3 + torch.roll(tokens, 1, dims=1)) % cfg.n_tags
    return TensorDataset(tokens, tags)


class ZeroTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)

        ds = make_data(cfg)
        self.sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=cfg.seed, drop_last=True)
        self.loader = DataLoader(ds, batch_size=cfg.micro_batch, sampler=self.sampler)

        model = Tagger(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        # decay once per epoch
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=len(self.loader),
                                                gamma=cfg.lr_decay)
        self.engine, self.opt, _, self.sched = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=self.ds_config())

    def ds_config(self):
        c = self.cfg
        conf = {
            "train_micro_batch_size_per_gpu": c.micro_batch,
            "gradient_accumulation_steps": c.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 1},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10_000,
        }
        conf.update(c.ds_extra)
        return conf

    def train(self):
        for epoch in range(self.cfg.epochs):
            self.sampler.set_epoch(epoch)
            for tokens, tags in self.loader:
                loss = self.engine(tokens, tags)
                self.engine.backward(loss)
                self.engine.step()
            if self.rank == 0:
                print(f"epoch {epoch} lr {self.sched.get_last_lr()[0]:.2e} "
                      f"steps {self.engine.global_steps}", flush=True)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    trainer = ZeroTrainer(TrainConfig())
    trainer.train()
    d = trainer.digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {d}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
