"""Multi-task (intent classification + slot-count regression) trainer on 2 spawned ranks.

No DDP wrapper: gradients are summed by hand once per window and divided by the world size.
The loop is split over small methods/hooks the way our in-house trainer does it.
"""
import hashlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TrainConfig:
    vocab: int = 64
    d_model: int = 48
    n_intents: int = 5
    seq_len: int = 12
    micro_batch: int = 8
    grad_accum: int = 4
    max_steps: int = 10
    lr: float = 3e-3
    weight_decay: float = 0.01
    max_grad_norm: float = 0.25
    reg_weight: float = 0.5
    log_every: int = 1
    seed: int = 7
    port: int = 49203


class MultiTaskNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.enc = nn.GRU(cfg.d_model, cfg.d_model, batch_first=True)
        self.intent_head = nn.Linear(cfg.d_model, cfg.n_intents)
        self.count_head = nn.Sequential(nn.Linear(cfg.d_model, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, tokens):
        h, _ = self.enc(self.emb(tokens))
        pooled = h.mean(1)
        return self.intent_head(pooled), self.count_head(pooled).squeeze(-1)


def make_batch(cfg, rank, step, micro):
    g = torch.Generator().manual_seed(cfg.seed * 100003 + rank * 7919 + step * 97 + micro)
    tokens = torch.randint(0, cfg.vocab, (cfg.micro_batch, cfg.seq_len), generator=g)
    intents = tokens[:, 0] % cfg.n_intents
    counts = (tokens < 8).float().sum(1)
    return tokens, intents, counts


class Trainer:
    def __init__(self, cfg, rank, world):
        self.cfg, self.rank, self.world = cfg, rank, world
        torch.manual_seed(cfg.seed)
        self.model = MultiTaskNet(cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.global_step = 0
        self.history = []

    # ---- hooks -------------------------------------------------------------------------
    def grad_norm(self):
        # total gradient norm, for the progress log
        return nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm).item()

    def after_backward(self, micro):
        if self.global_step % self.cfg.log_every == 0:
            self.history.append((self.global_step, micro, self.grad_norm()))

    def before_optimizer_step(self):
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(self.world)
        nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)

    # ---- loop --------------------------------------------------------------------------
    def compute_loss(self, batch):
        tokens, intents, counts = batch
        logits, pred_counts = self.model(tokens)
        ce = F.cross_entropy(logits, intents)
        reg = F.smooth_l1_loss(pred_counts, counts)
        return ce + self.cfg.reg_weight * reg

    def micro_step(self, micro):
        batch = make_batch(self.cfg, self.rank, self.global_step, micro)
        loss = self.compute_loss(batch) / self.cfg.grad_accum
        loss.backward()
        self.after_backward(micro)
        return loss.detach()

    def train_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for micro in range(self.cfg.grad_accum):
            total += self.micro_step(micro)
        self.before_optimizer_step()
        self.optimizer.step()
        self.global_step += 1
        return total

    def fit(self):
        while self.global_step < self.cfg.max_steps:
            loss = self.train_step()
            if self.rank == 0 and self.global_step % 5 == 0:
                print(f"step {self.global_step} loss {loss.item():.4f}", flush=True)


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainer = Trainer(cfg, rank, world)
    trainer.fit()
    h = hashlib.sha256()
    for _, p in trainer.model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = TrainConfig(port=int(sys.argv[1]) if len(sys.argv) > 1 else 49203)
    mp.spawn(worker, args=(2, cfg), nprocs=2, join=True)
