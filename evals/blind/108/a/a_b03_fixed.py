"""
Hand-written data-parallel trainer (no DDP wrapper): each rank accumulates its
K micro-batches locally, then one flat all-reduce per optimizer step.
Packed documents with per-document causal attention (the mask restarts at every
EOT), three parameter groups with their own base LRs and a shared warm-up +
cosine multiplier.

  torchrun --nproc-per-node 2 a_b03.py
"""
import argparse
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

EOT = 0


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=72)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--d-model", type=int, default=48)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--lr-emb", type=float, default=1e-2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


# ----------------------------------------------------------------------------- data
def packed_stream(n_tokens, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    parts, total = [], 0
    while total < n_tokens:
        L = int(torch.randint(3, 30, (1,), generator=g))
        a = int(torch.randint(1, vocab, (1,), generator=g))
        doc = (a + 2 * torch.arange(L)) % (vocab - 1) + 1
        flip = torch.rand(L, generator=g) < 0.2
        doc[flip] = torch.randint(1, vocab, (int(flip.sum()),), generator=g)
        parts += [doc, torch.tensor([EOT])]
        total += L + 1
    return torch.cat(parts)[:n_tokens]


class PackedLoader:
    """Deterministic sequential reader: rank r takes every W-th block of the stream."""

    def __init__(self, stream, block, bs, rank, world):
        self.stream, self.block, self.bs = stream, block, bs
        self.rank, self.world = rank, world
        self.pos = 0

    def next(self):
        xs, ys = [], []
        for _ in range(self.bs):
            b = self.pos * self.world + self.rank
            s = self.stream[b * (self.block + 1):(b + 1) * (self.block + 1)]
            xs.append(s[:-1])
            ys.append(s[1:])
            self.pos += 1
        return torch.stack(xs), torch.stack(ys)


def doc_causal_mask(x):
    """Block-diagonal causal mask: token i sees j <= i only inside its own document."""
    doc_id = torch.cumsum((x == EOT).long(), dim=1)
    doc_id = torch.cat([torch.zeros_like(doc_id[:, :1]), doc_id[:, :-1]], dim=1)
    T = x.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    same = doc_id.unsqueeze(2) == doc_id.unsqueeze(1)
    return (causal & same).unsqueeze(1)  # (B, 1, T, T), True = attend


# ----------------------------------------------------------------------------- model
class Attn(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attn(d, h)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        x = x + self.attn(self.n1(x), mask)
        return x + self.ff(self.n2(x))


class TinyLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.d_model)
        self.wpe = nn.Embedding(a.block, a.d_model)
        self.blocks = nn.ModuleList([Block(a.d_model, a.heads) for _ in range(a.layers)])
        self.norm = nn.LayerNorm(a.d_model)
        self.out = nn.Linear(a.d_model, a.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, x):
        mask = doc_causal_mask(x)
        h = self.wte(x) + self.wpe(torch.arange(x.size(1)))
        for b in self.blocks:
            h = b(h, mask)
        return self.out(self.norm(h))


# ----------------------------------------------------------------------------- trainer
class DataParallelTrainer:
    def __init__(self, args):
        self.a = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = TinyLM(args)
        for p in self.model.parameters():  # same start everywhere
            dist.broadcast(p.data, src=0)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self._param_groups(), betas=(0.9, 0.95))
        stream = packed_stream(200_000, args.vocab, args.seed)
        self.loader = PackedLoader(stream, args.block, args.micro_bs, self.rank, self.world)
        self.micro_step = 0
        self.global_step = 0
        self.sched_step = 0
        self._update_lr()

    def _param_groups(self):
        a = self.a
        emb, mats, other = [], [], []
        for n, p in self.model.named_parameters():
            if n.startswith(("wte", "wpe")):
                emb.append(p)
            elif p.dim() >= 2:
                mats.append(p)
            else:
                other.append(p)
        return [
            {"params": emb, "base_lr": a.lr_emb, "weight_decay": 0.0, "name": "emb"},
            {"params": mats, "base_lr": a.lr, "weight_decay": a.wd, "name": "mats"},
            {"params": other, "base_lr": a.lr, "weight_decay": 0.0, "name": "other"},
        ]

    def lr_mult(self, step):
        a = self.a
        if step < a.warmup:
            return (step + 1) / a.warmup
        t = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
        return a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t))

    def _update_lr(self):
        m = self.lr_mult(self.sched_step)
        for g in self.optimizer.param_groups:
            g["lr"] = g["base_lr"] * m
        self.sched_step += 1

    # --- hooks -------------------------------------------------------------
    def training_step(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def on_after_backward(self):
        self.micro_step += 1
        if self.micro_step % self.a.accum == 0:
            self.optimizer_step()

    def on_train_batch_end(self):
        if self.micro_step % self.a.accum == 0:
            self._update_lr()

    def optimizer_step(self):
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()
        torch.nn.utils.clip_grad_norm_(self.params, self.a.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1

    # --- loop --------------------------------------------------------------
    def fit(self):
        self.model.train()
        while self.global_step < self.a.steps:
            x, y = self.loader.next()
            loss = self.training_step(x, y)
            (loss / self.a.accum).backward()
            self.on_after_backward()
            self.on_train_batch_end()
            if self.rank == 0 and self.micro_step % (3 * self.a.accum) == 0:
                lrs = ", ".join(f"{g['name']}={g['lr']:.2e}" for g in self.optimizer.param_groups)
                print(f"step {self.global_step} loss {loss.item():.4f} lr {lrs}")


def main():
    args = get_args()
    dist.init_process_group("gloo")
    trainer = DataParallelTrainer(args)
    trainer.fit()
    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
