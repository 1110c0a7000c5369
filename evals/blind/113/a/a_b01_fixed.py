"""Causal LM pretraining on a DeepSpeed ZeRO-2 engine.

The DeepSpeed config is kept as an HF-style JSON template with "auto" placeholders;
`resolve_auto` fills them from the command-line arguments.
"""
import argparse
import hashlib
import json
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DS_TEMPLATE = """
{
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "zero_optimization": {
    "stage": 2,
    "overlap_comm": false,
    "contiguous_gradients": true,
    "reduce_bucket_size": "auto",
    "allgather_bucket_size": "auto"
  },
  "scheduler": {
    "type": "WarmupLR",
    "params": {"warmup_min_lr": 0.0, "warmup_max_lr": "auto", "warmup_num_steps": "auto"}
  },
  "zero_allow_untested_optimizer": true,
  "steps_per_print": 100000,
  "wall_clock_breakdown": false
}
"""


def resolve_auto(cfg, values):
    """Replace every "auto" with a value we know; keys we cannot resolve are left out
    so that DeepSpeed falls back on its own default."""
    out = {}
    for key, val in cfg.items():
        if isinstance(val, dict):
            out[key] = resolve_auto(val, values)
        elif val == "auto":
            if values.get(key) is not None:
                out[key] = values[key]
        else:
            out[key] = val
    return out


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab, d, seq, n_layer):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        # summed over positions, averaged over sequences
        nll = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
        return nll / idx.size(0)


def make_batch(step, micro, rank, args):
    g = torch.Generator().manual_seed(1000 + 97 * step + 13 * micro + rank)
    x = torch.randint(0, args.vocab, (args.micro_bs, args.seq_len + 1), generator=g)
    # a learnable pattern: next token = (token * 3 + 1) mod vocab half the time
    x[:, 1:] = torch.where(torch.rand(args.micro_bs, args.seq_len, generator=g) < 0.5,
                           (x[:, :-1] * 3 + 1) % args.vocab, x[:, 1:])
    return x[:, :-1], x[:, 1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq_len", type=int, default=16)
    p.add_argument("--d_model", type=int, default=32)
    p.add_argument("--micro_bs", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--max_grad_norm", type=float, default=0.0)  # 0 = no clipping
    p.add_argument("--max_steps", type=int, default=20)
    p.add_argument("--dump", default=None)
    args = p.parse_args()

    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()

    values = {
        "train_micro_batch_size_per_gpu": args.micro_bs,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_bs * args.grad_accum * world,
        "reduce_bucket_size": 500_000,
        "allgather_bucket_size": 500_000,
        "warmup_max_lr": args.lr,
        "warmup_num_steps": args.warmup_steps,
        "gradient_clipping": args.max_grad_norm,
    }
    ds_config = resolve_auto(json.loads(DS_TEMPLATE), values)

    model = TinyLM(args.vocab, args.d_model, args.seq_len, 2)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)

    for step in range(args.max_steps):
        for micro in range(args.grad_accum):
            idx, tgt = make_batch(step, micro, rank, args)
            loss = engine(idx, tgt)
            engine.backward(loss)
            engine.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e} gnorm {engine.get_global_grad_norm()}", flush=True)

    h = hashlib.sha256()
    for _, prm in engine.module.named_parameters():
        h.update(prm.detach().float().cpu().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if args.dump:
            torch.save({n: q.detach().float().clone() for n, q in engine.module.named_parameters()}, args.dump)
    dist.barrier()


if __name__ == "__main__":
    main()
