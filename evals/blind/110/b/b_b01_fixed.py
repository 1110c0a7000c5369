"""Tiny causal LM pre-training on synthetic token streams with a DeepSpeed ZeRO-2 engine.

The engine owns gradient accumulation (gradient_accumulation_steps in the config);
the warm-up + cosine schedule is ours (LambdaLR on the client AdamW) and is advanced
once per optimizer update.
"""
import argparse
import hashlib
import math
import os

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--d_model", type=int, default=48)
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--seq_len", type=int, default=24)
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=4)
    p.add_argument("--max_updates", type=int, default=16)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=17)
    return p.parse_args()


class TinyLM(nn.Module):
    def __init__(self, vocab, d, n_layer, seq_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq_len, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=2 * d, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        h = self.tok(idx) + self.pos[:T]
        h = self.body(h, mask=self.causal[:T, :T], is_causal=True)
        logits = self.lm_head(self.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def token_stream(args, rank, n_micro):
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    # a noisy affine recurrence so the LM has something to learn
    data = torch.empty(n_micro, args.micro_batch, args.seq_len + 1, dtype=torch.long)
    data[..., 0] = torch.randint(0, args.vocab, (n_micro, args.micro_batch), generator=g)
    for t in range(1, args.seq_len + 1):
        nxt = (data[..., t - 1] * 5 + 3) % args.vocab
        noise = torch.randint(0, args.vocab, nxt.shape, generator=g)
        keep = torch.rand(nxt.shape, generator=g) < 0.8
        data[..., t] = torch.where(keep, nxt, noise)
    for b in data:
        yield b[:, :-1], b[:, 1:]


def warmup_cosine(warmup, total):
    def f(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        prog = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * prog))
    return f


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(args.seed)

    model = TinyLM(args.vocab, args.d_model, args.n_layer, args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(args.warmup, args.max_updates))

    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * world,
        "gradient_clipping": args.clip,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 2, "overlap_comm": False,
                              "contiguous_gradients": True,
                              "reduce_bucket_size": 50000},
        "steps_per_print": 10_000,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                   config=ds_config)

    n_micro = args.max_updates * args.grad_accum
    for idx, tgt in token_stream(args, rank, n_micro):
        loss = engine(idx, tgt)
        engine.backward(loss)
        at_boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        if at_boundary:
            scheduler.step()

    h = hashlib.sha256()
    for name, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"updates={engine.global_steps} lr_last={scheduler.get_last_lr()[0]:.6f}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
