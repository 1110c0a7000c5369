"""Token-level LM fine-tune on a DeepSpeed ZeRO-1 engine.

The loss of an optimizer step is the sum of the token losses of the whole
global batch divided by the number of valid (non-pad) tokens in it, so long
and short sequences weigh the same per token no matter how they were split
over micro-batches and ranks.
"""
import argparse
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import deepspeed


@dataclass
class TrainConfig:
    vocab: int = 64
    dim: int = 32
    seq_len: int = 16
    micro_batch: int = 4
    grad_accum: int = 4
    max_steps: int = 8
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 1234
    pad_id: int = 0


class TinyLM(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.mix = nn.Sequential(nn.Linear(cfg.dim, 2 * cfg.dim), nn.GELU(), nn.Linear(2 * cfg.dim, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        h = h + self.mix(h)
        return self.lm_head(self.norm(h))


class TokenBatches:
    """Deterministic synthetic stream of padded sequences for one rank."""

    def __init__(self, cfg: TrainConfig, rank: int):
        self.cfg = cfg
        self.gen = torch.Generator().manual_seed(cfg.seed + 101 * rank)

    def __iter__(self):
        return self

    def __next__(self):
        c = self.cfg
        ids = torch.randint(1, c.vocab, (c.micro_batch, c.seq_len), generator=self.gen)
        lengths = torch.randint(3, c.seq_len + 1, (c.micro_batch,), generator=self.gen)
        pos = torch.arange(c.seq_len).unsqueeze(0)
        ids = ids.masked_fill(pos >= lengths.unsqueeze(1), c.pad_id)
        labels = ids.clone()
        labels[:, :-1] = ids[:, 1:]
        labels[:, -1] = c.pad_id
        labels = labels.masked_fill(labels == c.pad_id, -100)
        return {"input_ids": ids, "labels": labels}


class ZeroTrainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(cfg.seed)
        model = TinyLM(cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.grad_accum,
            "gradient_clipping": 0.0,
            "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": 1},
            "steps_per_print": 10_000,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.data = TokenBatches(cfg, self.rank)

    def global_token_count(self, window):
        n = sum(int((b["labels"] != -100).sum()) for b in window)
        n = torch.tensor(float(n))
        dist.all_reduce(n)
        return n

    def compute_loss(self, batch, n_tokens):
        logits = self.engine(batch["input_ids"])
        tok_sum = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch["labels"].reshape(-1), ignore_index=-100, reduction="sum"
        )
        # DeepSpeed averages the gradients over the ranks, so scale the share of
        # the window-wide normaliser back up by the world size.
        return tok_sum / n_tokens * self.world

    def train(self):
        for step in range(self.cfg.max_steps):
            window = [next(self.data) for _ in range(self.cfg.grad_accum)]
            n_tokens = self.global_token_count(window)
            for batch in window:
                loss = self.compute_loss(batch, n_tokens)
                self.engine.backward(loss)
                self.engine.step()
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} lr {self.engine.get_lr()[0]:.4f}", flush=True)

    def final_digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--max-steps", type=int, default=TrainConfig.max_steps)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    cfg = TrainConfig(max_steps=args.max_steps)
    trainer = ZeroTrainer(cfg)
    trainer.train()
    digest = trainer.final_digest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
