"""Tiny causal LM with an auxiliary parity head, multi-task uncertainty weighting
(Kendall et al.), trained on a DeepSpeed ZeRO-0 engine.

"""
import argparse
import hashlib

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--seq_len", type=int, default=24)
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=0.0)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, d, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(2)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.parity = nn.Linear(d, 2)

    def forward(self, idx, targets):
        T = idx.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=idx.device), 1)
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        h = self.ln_f(x)
        logits = self.head(h)
        lm = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        aux = F.cross_entropy(self.parity(h).reshape(-1, 2), (targets % 2).reshape(-1))
        return lm, aux


class UncertaintyWeighting(nn.Module):
    """sum_i exp(-s_i) * L_i + s_i with learned log-variances s_i."""

    def __init__(self, n_tasks):
        super().__init__()
        self.log_vars = nn.Parameter(torch.zeros(n_tasks))

    def forward(self, *losses):
        total = 0.0
        for i, l in enumerate(losses):
            total = total + torch.exp(-self.log_vars[i]) * l + self.log_vars[i]
        return total


def ds_config(args, world):
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * world,
        "gradient_clipping": args.clip,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 1000,
    }


def batches(args, rank, world, n):
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, args.vocab, (n * world * args.micro_batch, args.seq_len + 1), generator=g)
    # a learnable structure: token t+1 = (3 * t + 1) mod vocab in the second half
    data[:, args.seq_len // 2:] = (3 * data[:, args.seq_len // 2 - 1:-1] + 1) % args.vocab
    for i in range(n):
        lo = (i * world + rank) * args.micro_batch
        chunk = data[lo:lo + args.micro_batch]
        yield chunk[:, :-1], chunk[:, 1:]


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.d_model, args.seq_len)
    weighting = UncertaintyWeighting(2)
    optimizer = torch.optim.AdamW([
        {"params": model.parameters(), "weight_decay": 0.01},
        {"params": weighting.parameters(), "weight_decay": 0.0, "lr": 10 * args.lr},
    ], lr=args.lr, betas=(0.9, 0.95))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=ds_config(args, world))
    for step, (x, y) in enumerate(batches(args, rank, world, args.steps * args.grad_accum)):
        lm, aux = engine(x, y)
        loss = weighting(lm, aux)
        engine.backward(loss)
        engine.step()
    params = list(engine.module.named_parameters()) + list(weighting.named_parameters())
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in params])
    if rank == 0:
        print(f"global steps {engine.global_steps}")
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
