"""Bradley-Terry reward model, DDP, an in-house trainer class split over hooks."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIG = dict(
    vocab=64,
    seq_len=20,
    d_model=48,
    pairs_per_micro=6,
    grad_accum=2,
    total_updates=14,
    lr=1e-3,
    warmup=3,
    max_grad_norm=1.0,
    seed=2024,
)


class RewardModel(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d), nn.Tanh())
        self.score = nn.Linear(d, 1)

    def forward(self, ids):
        h = self.mix(self.emb(ids))
        return self.score(h.mean(dim=1)).squeeze(-1)


class PreferenceStream:
    def __init__(self, cfg, rank):
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(cfg["seed"] + 977 * rank)

    def next(self):
        c = self.cfg
        chosen = torch.randint(0, c["vocab"], (c["pairs_per_micro"], c["seq_len"]), generator=self.g)
        rejected = chosen.clone()
        flip = torch.rand(chosen.shape, generator=self.g) < 0.3
        rejected[flip] = torch.randint(0, c["vocab"] // 2, (int(flip.sum()),), generator=self.g)
        return chosen, rejected


class RMTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        torch.manual_seed(cfg["seed"])
        self.model = DDP(RewardModel(cfg["vocab"], cfg["d_model"]))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg["lr"], weight_decay=0.01)
        warm = cfg["warmup"]
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / warm))
        self.data = PreferenceStream(cfg, self.rank)
        self.update = 0

    # ---- hooks -------------------------------------------------------------
    def setup(self):
        self._sanity_check()

    def _sanity_check(self):
        """One forward/backward on a probe batch: every parameter must receive a gradient."""
        probe = PreferenceStream(self.cfg, rank=1000 + self.rank).next()
        loss = self.compute_loss(*probe)
        loss.backward()
        missing = [n for n, p in self.model.module.named_parameters() if p.grad is None]
        assert not missing, f"parameters without gradient: {missing}"
        self.model.zero_grad(set_to_none=True)
        if self.rank == 0:
            print(f"sanity check ok, probe loss {loss.item():.4f}", flush=True)

    def compute_loss(self, chosen, rejected):
        r = self.model(torch.cat([chosen, rejected]))
        r_c, r_r = r.chunk(2)
        return -F.logsigmoid(r_c - r_r).mean()

    def micro_step(self, batch, sync):
        K = self.cfg["grad_accum"]
        if sync:
            loss = self.compute_loss(*batch) / K
            loss.backward()
        else:
            with self.model.no_sync():
                loss = self.compute_loss(*batch) / K
                loss.backward()
        return loss.detach() * K

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["max_grad_norm"])
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.update += 1

    def fit(self):
        self.setup()
        K = self.cfg["grad_accum"]
        while self.update < self.cfg["total_updates"]:
            losses = [self.micro_step(self.data.next(), sync=(k == K - 1)) for k in range(K)]
            self.optimizer_step()
            if self.rank == 0 and self.update % 4 == 0:
                print(f"update {self.update} loss {torch.stack(losses).mean():.4f}", flush=True)

    def final_hash(self):
        h = hashlib.sha256()
        for _, p in self.model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    trainer = RMTrainer(CONFIG)
    trainer.fit()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {trainer.final_hash()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
