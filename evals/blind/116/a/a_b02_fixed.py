"""FSDP2 (fully_shard) causal-LM fine-tune under bf16 compute / fp32 reduce.

The tokenizer gains 8 special tokens during `Trainer.setup_vocab`; the token
embedding gets its own SGD optimizer (sparse-ish updates), the blocks and
head use AdamW.  Accumulation: K micro-batches per rank, sync on the last.
"""
import argparse, hashlib, os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, d=32, n_layer=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 64, bias=False)   # predicts base-vocab ids only

    def forward(self, idx):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))

    def grow_vocab(self, n_new):
        old = self.embed
        new = nn.Embedding(old.num_embeddings + n_new, old.embedding_dim)
        src = old.weight.full_tensor() if isinstance(old.weight, DTensor) else old.weight
        with torch.no_grad():
            new.weight[: old.num_embeddings].copy_(src)
            new.weight[old.num_embeddings:].copy_(src.mean(0, keepdim=True))
        self.embed = new


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        self.model = TinyLM(vocab=64)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in self.model.blocks:
            fully_shard(blk, mp_policy=mp)
        self.setup_vocab()
        fully_shard(self.model, mp_policy=mp)
        emb = list(self.model.embed.parameters())
        rest = [p for n, p in self.model.named_parameters() if not n.startswith("embed.")]
        self.opt_body = torch.optim.AdamW(rest, lr=args.lr, weight_decay=0.0)
        self.opt_emb = torch.optim.SGD(emb, lr=args.emb_lr, momentum=0.9)

    def setup_vocab(self):
        self.model.grow_vocab(self.args.new_tokens)

    def batches(self):
        g = torch.Generator().manual_seed(100 + self.rank)
        V = 64 + self.args.new_tokens
        for _ in range(self.args.steps * self.args.accum):
            x = torch.randint(0, V, (self.args.bs, self.args.seq), generator=g)
            y = (x * 7 + 3) % 64
            yield x, y

    def micro_step(self, x, y, sync):
        self.model.set_requires_gradient_sync(sync)
        logits = self.model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, 64), y.reshape(-1))
        (loss / self.args.accum).backward()

    def optimizer_step(self):
        for o in (self.opt_body, self.opt_emb):
            o.step()
            o.zero_grad(set_to_none=True)

    def fit(self):
        K = self.args.accum
        for i, (x, y) in enumerate(self.batches()):
            last = (i + 1) % K == 0
            self.micro_step(x, y, sync=last)
            if last:
                self.optimizer_step()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            full = p.full_tensor() if isinstance(p, DTensor) else p
            t = full.detach().float().contiguous()
            h.update(t.numpy().tobytes())
        return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--bs", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--emb-lr", type=float, default=0.5)
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    tr = Trainer(args)
    tr.fit()
    d = tr.digest()
    if dist.get_rank() == 0:
        print("FINAL_SHA256", d, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
