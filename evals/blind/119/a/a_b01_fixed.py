"""Token-level LM fine-tuning on DeepSpeed ZeRO-3, driven by a small config object."""
import hashlib
import os
from dataclasses import dataclass

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TrainConfig:
    vocab: int = 97
    dim: int = 48
    seq_len: int = 24
    micro_batch: int = 4
    grad_accum: int = 3
    steps: int = 10
    lr: float = 3e-3
    seed: int = 1234
    pad_id: int = 0


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.dim) * 0.02)
        self.mix = nn.Sequential(nn.Linear(cfg.dim, 2 * cfg.dim), nn.GELU(), nn.Linear(2 * cfg.dim, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        h = h + self.mix(h)
        return self.head(self.norm(h))


def make_batches(cfg, rank, n):
    g = torch.Generator().manual_seed(cfg.seed + 17 * rank)
    out = []
    for _ in range(n):
        ids = torch.randint(1, cfg.vocab, (cfg.micro_batch, cfg.seq_len + 1), generator=g)
        # ragged documents: rank 1 gets much shorter ones
        hi = cfg.seq_len if rank == 0 else cfg.seq_len // 3
        lens = torch.randint(3, hi + 1, (cfg.micro_batch,), generator=g)
        mask = torch.arange(cfg.seq_len + 1)[None, :] < lens[:, None]
        ids = ids.masked_fill(~mask, cfg.pad_id)
        labels = ids[:, 1:].clone().masked_fill(~mask[:, 1:], -100)
        out.append((ids[:, :-1].contiguous(), labels))
    return out


class ZeroTrainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 3},
            "optimizer": {"type": "AdamW", "params": {"lr": cfg.lr, "weight_decay": 0.01}},
            "steps_per_print": 10 ** 9,
        }
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = TinyLM(cfg)
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        self.data = make_batches(cfg, self.rank, cfg.steps * cfg.grad_accum)

    def window_tokens(self, window):
        return sum(int((lab != -100).sum()) for _, lab in window)

    def micro_loss(self, ids, labels, n_tokens):
        logits = self.engine(ids)
        tok_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                  ignore_index=-100, reduction="sum")
        # DeepSpeed divides by GA and averages the ranks: undo both so the window
        # loss is sum over tokens / tokens in the window
        return tok_sum / n_tokens * self.cfg.grad_accum * self.world

    def fit(self):
        K = self.cfg.grad_accum
        for step in range(self.cfg.steps):
            window = self.data[step * K:(step + 1) * K]
            n_tokens = torch.tensor(float(self.window_tokens(window)))
            dist.all_reduce(n_tokens)
            for ids, labels in window:
                loss = self.micro_loss(ids, labels, n_tokens)
                self.engine.backward(loss)
                self.engine.step()

    def final_sha(self):
        params = list(self.engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in params]):
            if self.rank == 0:
                h = hashlib.sha256()
                for _, p in params:
                    h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
                return h.hexdigest()
        return None


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    trainer = ZeroTrainer(TrainConfig())
    trainer.fit()
    sha = trainer.final_sha()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
