"""
Data parallelism by hand (no DDP): variable-length sequences, ranks with
different micro-batch sizes (rank 0: 3 sequences, rank 1: 5), activation
checkpointing, a frozen learned position table, two optimizers (AdamW for the
transformer body, SGD with momentum for the embedding and the output head), and
a stop/resume at an optimizer-step boundary into freshly built objects.

Objective of one optimizer step: the sum of token losses over every target
token of the window (all micro-batches, all ranks) divided by that token count.
Each rank backpropagates its token-loss sum / global count, then the gradients
are SUM-reduced once per window.

  torchrun --nproc-per-node 2 a_c02.py
"""
import hashlib
import os
import tempfile
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE = -100


@dataclass
class Cfg:
    vocab: int = 64
    max_len: int = 40
    d: int = 48
    heads: int = 4
    layers: int = 3
    accum: int = 3
    micro_bs: dict = field(default_factory=lambda: {0: 3, 1: 5})
    total_steps: int = 10
    stop_after: int = 5  # simulate preemption: checkpoint, tear down, rebuild, resume
    lr_body: float = 2e-3
    lr_emb: float = 0.05
    wd: float = 0.05
    seed: int = 11


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(c.d), nn.LayerNorm(c.d)
        self.qkv, self.o = nn.Linear(c.d, 3 * c.d), nn.Linear(c.d, c.d)
        self.ff = nn.Sequential(nn.Linear(c.d, 3 * c.d), nn.GELU(), nn.Linear(3 * c.d, c.d))
        self.h = c.heads

    def forward(self, x, keep):
        B, T, C = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, C))
        return x + self.ff(self.n2(x))


class LM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.d)
        self.pos = nn.Parameter(torch.randn(c.max_len, c.d) * 0.02)
        self.body = nn.ModuleList([Block(c) for _ in range(c.layers)])
        self.norm = nn.LayerNorm(c.d)
        self.head = nn.Linear(c.d, c.vocab, bias=False)

    def forward(self, x, lengths):
        B, T = x.shape
        ar = torch.arange(T)
        keep = (ar[None, :] <= ar[:, None])[None, None] & (ar[None, None, None, :] < lengths[:, None, None, None])
        h = self.emb(x) + self.pos[:T]
        for blk in self.body:
            h = checkpoint(blk, h, keep, use_reentrant=False)
        return self.head(self.norm(h))


def sequences(c, n):
    g = torch.Generator().manual_seed(c.seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(5, c.max_len + 1, (1,), generator=g))
        a, s = int(torch.randint(1, c.vocab, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        seq = (a + s * torch.arange(L)) % (c.vocab - 1) + 1
        m = torch.rand(L, generator=g) < 0.2
        seq[m] = torch.randint(1, c.vocab, (int(m.sum()),), generator=g)
        out.append(seq)
    return out


def rank_micro_batches(c, seqs, rank, world):
    """Rank r takes sequences in its own contiguous slice, cut into micro-batches of micro_bs[r]."""
    per_window = [c.micro_bs[r] * c.accum for r in range(world)]
    stride = sum(per_window)
    start = sum(per_window[:rank])
    bs = c.micro_bs[rank]
    batches = []
    for w in range(len(seqs) // stride):
        base = w * stride + start
        for m in range(c.accum):
            idx = list(range(base + m * bs, base + (m + 1) * bs))
            batches.append(pad([seqs[i] for i in idx]))
    return batches


def pad(group):
    T = max(len(s) for s in group) - 1
    x = torch.zeros(len(group), T, dtype=torch.long)
    y = torch.full((len(group), T), IGNORE, dtype=torch.long)
    lengths = torch.tensor([len(s) - 1 for s in group])
    for i, s in enumerate(group):
        x[i, : len(s) - 1], y[i, : len(s) - 1] = s[:-1], s[1:]
    return x, y, lengths


def build(c, init_seed):
    torch.manual_seed(init_seed)
    model = LM(c)
    model.pos.requires_grad_(False)  # frozen position table
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    emb_params = [model.emb.weight, model.head.weight]
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith(("emb", "head"))]
    opt_body = torch.optim.AdamW(
        [{"params": [p for p in body if p.dim() >= 2], "weight_decay": c.wd},
         {"params": [p for p in body if p.dim() < 2], "weight_decay": 0.0}],
        lr=c.lr_body, betas=(0.9, 0.95))
    opt_emb = torch.optim.SGD(emb_params, lr=c.lr_emb, momentum=0.9)
    return model, [opt_body, opt_emb]


def sync_grads(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)  # SUM: each rank's loss already carries 1 / global count
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def train(c, model, opts, batches, start_step, end_step, rank):
    model.train()
    for step in range(start_step, end_step):
        window = batches[step * c.accum:(step + 1) * c.accum]
        n = torch.tensor(float(sum(int((y != IGNORE).sum()) for _, y, _ in window)))
        dist.all_reduce(n)
        tot = 0.0
        for x, y, lengths in window:
            logits = model(x, lengths)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum") / n
            loss.backward()
            tot += loss.item()
        sync_grads(model)
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} tokens {int(n)} local loss share {tot:.4f}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Cfg()
    seqs = sequences(c, 8 * c.accum * c.total_steps)
    batches = rank_micro_batches(c, seqs, rank, world)

    ckpt = os.path.join(tempfile.gettempdir(), f"a_c02_ckpt_r{rank}_{os.getppid()}.pt")
    model, opts = build(c, c.seed)
    train(c, model, opts, batches, 0, c.stop_after, rank)
    torch.save({"model": model.state_dict(), "opts": [o.state_dict() for o in opts],
                "step": c.stop_after}, ckpt)
    del model, opts

    # ---- resume into new objects (different init seed: everything must come from the file)
    model, opts = build(c, c.seed + 99)
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    for o, s in zip(opts, state["opts"]):
        o.load_state_dict(s)
    os.remove(ckpt)
    train(c, model, opts, batches, state["step"], c.total_steps, rank)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
