"""nanoGPT-style SFT on spawned ranks without a DDP wrapper.

Every optimizer step reads its window of K micro-batches ahead, counts the
answer tokens of the whole window on all ranks, and backpropagates each
micro-batch's token-loss sum divided by that count.  Gradients are summed over
ranks with one flat all-reduce per window.  The run is interrupted halfway,
checkpointed at a window boundary and resumed into freshly built objects.
"""
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, EMBD, HEADS, LAYERS = 50, 20, 32, 4, 2
MICRO_BS, GRAD_ACCUM = 3, 3
TOTAL_STEPS, STOP_AT = 12, 6
LR, WARMUP = 2e-3, 3
PORT = 49209


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(), nn.Linear(4 * EMBD, EMBD))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBD)
        self.wpe = nn.Embedding(BLOCK, EMBD)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(EMBD)
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def micro_batch(rank, step, k):
    """Deterministic synthetic prompt/answer pairs; prompt lengths vary."""
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + k)
    idx = torch.randint(VOCAB, (MICRO_BS, BLOCK + 1), generator=g)
    prompt_len = torch.randint(3, BLOCK - 2, (MICRO_BS,), generator=g)
    labels = idx[:, 1:].clone()
    pos = torch.arange(BLOCK)[None, :]
    labels[pos < prompt_len[:, None]] = -100
    return idx[:, :-1], labels


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    return 0.5 * LR * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL_STEPS - WARMUP)))


def build():
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    return model, opt


def train(model, opt, rank, start, stop):
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(start, stop):
        window = [micro_batch(rank, step, k) for k in range(GRAD_ACCUM)]
        n_tok = torch.tensor(float(sum((y != -100).sum() for _, y in window)))
        dist.all_reduce(n_tok)
        for x, y in window:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1),
                                   ignore_index=-100, reduction="sum") / n_tok
            loss.backward()
        flat = torch.cat([p.grad.view(-1) for p in params])
        dist.all_reduce(flat)
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 3 == 0:
            print(f"step {step} tokens {int(n_tok)}")


def worker(rank, world, ckpt_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    model, opt = build()
    train(model, opt, rank, 0, STOP_AT)
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": STOP_AT}, path)
    dist.barrier()
    del model, opt

    model, opt = build()  # fresh objects, as after a restart
    ckpt = torch.load(path, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    train(model, opt, rank, ckpt["step"], TOTAL_STEPS)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, d), nprocs=2, join=True)
