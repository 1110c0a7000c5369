"""Prompt-masked SFT of a tiny decoder with FSDP2 (fully_shard), bf16 compute, 2 CPU ranks.

* MixedPrecisionPolicy: bf16 parameters for compute, fp32 gradient reduction. While the
  reduce-scatter is off (all micro-steps but the window's last), FSDP2 keeps the
  unsharded gradients in the reduce dtype, so the window accumulates in fp32.
* Loss: summed token cross-entropy over the answer tokens, divided by the window's
  answer-token count on all ranks, times the world size (FSDP2 averages over ranks).
* The sinusoid-initialised position table is frozen; the token embedding has its own
  SGD optimizer, the rest AdamW; one global clip over both.
"""
import argparse
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

IGNORE = -100


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=48)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max_len", type=int, default=20)
    ap.add_argument("--micro_bs", type=int, default=3)
    ap.add_argument("--accum", type=int, default=3)
    ap.add_argument("--windows_per_rank", type=int, default=10)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--emb_lr", type=float, default=0.05)
    ap.add_argument("--max_norm", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=5)
    return ap.parse_args()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = 4

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, vocab, dim, layers, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        with torch.no_grad():
            pos = torch.arange(max_len).unsqueeze(1)
            div = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
            self.pos.weight[:, 0::2] = torch.sin(pos * div)
            self.pos.weight[:, 1::2] = torch.cos(pos * div)
        self.pos.weight.requires_grad_(False)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            h = blk(h)
        return self.out(self.norm(h))


def make_examples(args, n, seed):
    """Prompt = random tokens; answer = the prompt reversed (then padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, args.max_len, dtype=torch.long)
    labels = torch.full((n, args.max_len), IGNORE, dtype=torch.long)
    for i in range(n):
        p = int(torch.randint(3, args.max_len // 2, (1,), generator=g))
        prompt = torch.randint(2, args.vocab, (p,), generator=g)
        seq = torch.cat([prompt, torch.tensor([1]), prompt.flip(0)])[: args.max_len]
        ids[i, : len(seq)] = seq
        labels[i, p: len(seq) - 1] = seq[p + 1:]  # predict answer tokens only
    return ids, labels


def full_digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(args.seed)

    model = Decoder(args.vocab, args.dim, args.layers, args.max_len)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)

    emb_params = [model.tok.weight]
    other = [p for n, p in model.named_parameters() if p.requires_grad and n != "tok.weight"]
    opt_main = torch.optim.AdamW(other, lr=args.lr, weight_decay=0.01)
    opt_emb = torch.optim.SGD(emb_params, lr=args.emb_lr, momentum=0.9)
    trainable = emb_params + other

    per_rank = args.windows_per_rank * args.accum * args.micro_bs
    ids, labels = make_examples(args, world * per_rank, args.seed + 1)
    ids, labels = ids[rank * per_rank:(rank + 1) * per_rank], labels[rank * per_rank:(rank + 1) * per_rank]

    step = 0
    for w in range(args.windows_per_rank):
        micro = [slice((w * args.accum + i) * args.micro_bs, (w * args.accum + i + 1) * args.micro_bs)
                 for i in range(args.accum)]
        n_tokens = torch.tensor(float(sum(int((labels[s] != IGNORE).sum()) for s in micro)))
        dist.all_reduce(n_tokens)
        window_loss = 0.0
        for i, s in enumerate(micro):
            model.set_requires_gradient_sync(i == args.accum - 1)
            logits = model(ids[s]).float()
            loss = F.cross_entropy(logits.view(-1, args.vocab), labels[s].view(-1),
                                   ignore_index=IGNORE, reduction="sum")
            (loss * world / n_tokens).backward()
            window_loss += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(trainable, args.max_norm)
        opt_main.step()
        opt_emb.step()
        opt_main.zero_grad(set_to_none=True)
        opt_emb.zero_grad(set_to_none=True)
        step += 1
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss(rank0 part) {window_loss / float(n_tokens):.4f} "
                  f"grad norm {float(norm.full_tensor() if isinstance(norm, DTensor) else norm):.3f}")

    digest = full_digest(model)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
