"""Dual-encoder retrieval fine-tuning on DeepSpeed ZeRO-3.

Each query comes with one positive and one hard-negative passage; the loss is a
2-way softmax over (positive, hard negative) scores per query.  Synthetic data,
random init, launched with torchrun (2 ranks).
"""
import hashlib
from dataclasses import dataclass, asdict

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RetrievalConfig:
    vocab_size: int = 300
    hidden: int = 48
    max_len: int = 12
    micro_batch_size: int = 6
    grad_accum: int = 4
    max_steps: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.01
    temperature: float = 0.1
    seed: int = 1234


class DualEncoder(nn.Module):
    def __init__(self, cfg: RetrievalConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=0)
        self.mix = nn.Linear(cfg.hidden, cfg.hidden)
        self.query_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.passage_proj = nn.Linear(cfg.hidden, cfg.hidden)

    def encode(self, ids, tower):
        mask = (ids != 0).float().unsqueeze(-1)
        h = torch.tanh(self.mix(self.tok(ids)))
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        proj = self.query_proj if tower == "query" else self.passage_proj
        return F.normalize(proj(pooled), dim=-1)

    def forward(self, q_ids, pos_ids, neg_ids):
        q = self.encode(q_ids, "query")
        return q, self.encode(pos_ids, "passage"), self.encode(neg_ids, "passage")


def synthetic_triples(cfg, rank, n_micro):
    g = torch.Generator().manual_seed(cfg.seed + 97 * rank)
    out = []
    for _ in range(n_micro):
        def rand_ids():
            lens = torch.randint(4, cfg.max_len + 1, (cfg.micro_batch_size,), generator=g)
            ids = torch.randint(1, cfg.vocab_size, (cfg.micro_batch_size, cfg.max_len), generator=g)
            ids[torch.arange(cfg.max_len)[None, :] >= lens[:, None]] = 0
            return ids
        q = rand_ids()
        pos = q.clone()
        noise = torch.rand(pos.shape, generator=g) < 0.3
        pos[noise & (pos != 0)] = torch.randint(1, cfg.vocab_size, (int((noise & (pos != 0)).sum()),), generator=g)
        out.append({"q": q, "pos": pos, "neg": rand_ids()})
    return out


class RetrievalTrainer:
    def __init__(self, cfg: RetrievalConfig):
        self.cfg = cfg
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = dist.get_rank()
        torch.manual_seed(cfg.seed)
        model = DualEncoder(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 3},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1000,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.data = synthetic_triples(cfg, self.rank, cfg.max_steps * cfg.grad_accum)

    def compute_loss(self, batch):
        q, pos, neg = self.engine(batch["q"], batch["pos"], batch["neg"])
        scores = torch.stack([(q * pos).sum(-1), (q * neg).sum(-1)], dim=1) / self.cfg.temperature
        target = torch.zeros(scores.size(0), dtype=torch.long)
        return F.cross_entropy(scores, target)

    def train(self):
        self.engine.train()
        for i, batch in enumerate(self.data):
            loss = self.compute_loss(batch)
            self.engine.backward(loss)
            self.engine.step()
            if self.rank == 0 and (i + 1) % 8 == 0:
                print(f"micro {i + 1} step {self.engine.global_steps} loss {loss.item():.4f}")

    def final_digest(self):
        params = [p for _, p in self.engine.module.named_parameters()]
        h = hashlib.sha256()
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            for p in params:
                h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    trainer = RetrievalTrainer(RetrievalConfig())
    trainer.train()
    digest = trainer.final_digest()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()


if __name__ == "__main__":
    main()
