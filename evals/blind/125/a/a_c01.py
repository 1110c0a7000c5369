"""ZeRO-2 causal LM trainer with ragged per-rank batches.

Rank 0 reads 3 sequences per micro-batch, rank 1 reads 5; sequences are padded
and the loss is the token sum over the window's all-ranks token count. The
engine divides by gradient_accumulation_steps and averages over ranks, so the
trainer multiplies by K * W. Frozen token embedding, client warm-up schedule
owned by the engine, clip 0.5.
"""
import hashlib
import math

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, T = 64, 32, 14
K = 3
STEPS = 9
ROWS_PER_RANK = {0: 3, 1: 5}
SEED = 31337

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,     # nominal; ranks feed ragged batches
    "gradient_accumulation_steps": K,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 2, "reduce_scatter": True, "contiguous_gradients": True},
    "steps_per_print": 10 ** 6,
}


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(T, D) * 0.02)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.ln = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, ids):
        h = self.embed(ids) + self.pos[: ids.size(1)]
        h, _ = self.rnn(h)
        return self.lm_head(self.ln(h))


def make_rank_batches(rank, world):
    g = torch.Generator().manual_seed(SEED + 1)
    out = {r: [] for r in range(world)}
    for _ in range(STEPS * K):
        for r in range(world):
            n = ROWS_PER_RANK[r]
            ids = torch.randint(1, VOCAB, (n, T), generator=g)
            lengths = torch.randint(4, T + 1, (n,), generator=g)
            labels = ids.clone()
            pad = torch.arange(T)[None, :] >= lengths[:, None]
            ids[pad] = 0
            labels[pad] = -100
            out[r].append((ids, labels))
    return out[rank]


class LMTrainer:
    def __init__(self):
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(SEED)
        model = TinyLM()
        model.embed.weight.requires_grad_(False)
        groups = [
            {"params": [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2],
             "weight_decay": 0.05},
            {"params": [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2],
             "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=4e-3)
        warm = 3
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, STEPS) / STEPS)))
        self.engine, _, _, self.sched = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=DS_CONFIG)

    def window_tokens(self, window):
        n = torch.tensor(sum(int((lab[:, 1:] != -100).sum()) for _, lab in window), dtype=torch.float64)
        dist.all_reduce(n)
        return n.item()

    def fit(self):
        batches = make_rank_batches(self.rank, self.world)
        gas = self.engine.gradient_accumulation_steps()
        for w in range(STEPS):
            window = batches[w * gas:(w + 1) * gas]
            n_tok = self.window_tokens(window)
            for ids, labels in window:
                logits = self.engine(ids)
                tok_sum = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                          ignore_index=-100, reduction="sum")
                loss = tok_sum / n_tok * gas * self.world
                self.engine.backward(loss)
                at_boundary = self.engine.is_gradient_accumulation_boundary()
                self.engine.step()
            assert at_boundary
            if self.rank == 0:
                print(f"step {self.engine.global_steps} lr {self.sched.get_last_lr()[0]:.5f} "
                      f"grad_norm {self.engine.get_global_grad_norm():.4f}")

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = LMTrainer()
    t.fit()
    d = t.digest()
    if t.rank == 0:
        print("FINAL_SHA256", d)
