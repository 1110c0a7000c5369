"""nanoGPT-flavoured training on self-spawned DDP ranks (gloo, 2 CPU processes), gradient_accumulation_steps = 3.

Matrices on AdamW, embeddings on SGD-momentum, one global-norm clip over both at each step, a warm-up + cosine
get_lr(iter_num). Halfway through, the run checkpoints at an update boundary, tears everything down and resumes
into freshly built model, DDP wrapper and optimizers. Run with `python c_c03.py`.
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
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49223
vocab_size, n_embd, block_size = 64, 32, 16
batch_size = 4
gradient_accumulation_steps = 3
max_iters = 8
resume_at = 4
learning_rate, min_lr, warmup_iters = 4e-3, 4e-4, 2
emb_lr = 0.3
grad_clip = 0.25


class MiniGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln = nn.LayerNorm(n_embd)
        self.attn_qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        q, k, v = self.attn_qkv(self.ln(x)).chunk(3, -1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        x = x + self.mlp(self.ln(x))
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, vocab_size), targets.reshape(-1))


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def get_batch(it, micro_step, rank, world):
    g = torch.Generator().manual_seed(10_000 * it + 100 * micro_step + rank)
    data = torch.randint(0, vocab_size, (batch_size, block_size + 1), generator=g)
    return data[:, :-1], data[:, 1:]


def build(rank):
    torch.manual_seed(1337)
    raw = MiniGPT()
    model = DDP(raw)
    emb = [raw.wte.weight, raw.wpe.weight]
    emb_ids = {id(p) for p in emb}
    mats = [p for p in raw.parameters() if id(p) not in emb_ids]
    opt_main = torch.optim.AdamW(mats, lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    opt_emb = torch.optim.SGD(emb, lr=emb_lr, momentum=0.9)
    return raw, model, [opt_main, opt_emb]


def train(rank, world, ckpt_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    raw, model, opts = build(rank)
    iter_num = 0
    while iter_num < max_iters:
        if iter_num == resume_at and not os.path.exists(ckpt_path):
            if rank == 0:
                torch.save({"model": raw.state_dict(), "opts": [o.state_dict() for o in opts], "iter_num": iter_num},
                           ckpt_path)
            dist.barrier()
            del raw, model, opts
            raw, model, opts = build(rank)  # a fresh process would start exactly here
            ck = torch.load(ckpt_path, weights_only=True)
            raw.load_state_dict(ck["model"])
            for o, s in zip(opts, ck["opts"]):
                o.load_state_dict(s)
            iter_num = ck["iter_num"]

        scale = get_lr(iter_num) / learning_rate
        for o, base in zip(opts, (learning_rate, emb_lr)):
            for g in o.param_groups:
                g["lr"] = base * scale

        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            X, Y = get_batch(iter_num, micro_step, rank, world)
            loss = model(X, Y) / gradient_accumulation_steps
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), grad_clip)
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"iter {iter_num} loss {loss.item() * gradient_accumulation_steps:.4f} norm {norm.item():.3f}", flush=True)
        iter_num += 1

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(train, args=(2, os.path.join(d, "ckpt.pt")), nprocs=2, join=True)
