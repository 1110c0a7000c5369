# nanoGPT-flavoured DDP training of a tiny causal transformer on synthetic tokens,
# interrupted after `stop_at` optimizer steps: everything is saved, the process rebuilds
# model, DDP wrapper and both optimizers from scratch, loads the checkpoint and carries on.
# Matrices train with AdamW, the two embedding tables with plain SGD.
# Launch: torchrun --nproc-per-node 2 c_c02.py
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# config (nanoGPT style globals)
vocab_size = 96
block_size = 24
n_layer = 2
n_head = 2
n_embd = 32
batch_size = 4                      # micro-batch per rank
gradient_accumulation_steps = 4     # micro-steps per optimizer step
max_iters = 20                      # optimizer steps
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 4
stop_at = 9                         # simulated preemption after this many steps
ckpt_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c02_ckpt")
grad_clip = 1.0
seed = 1337
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, causal):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=causal, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, causal)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def build(init_seed):
    torch.manual_seed(init_seed)
    model = GPT()
    ddp_model = DDP(model)
    raw_model = ddp_model.module
    emb = [raw_model.wte.weight, raw_model.wpe.weight]
    emb_ids = {id(p) for p in emb}
    rest = [p for p in raw_model.parameters() if id(p) not in emb_ids]
    adamw = torch.optim.AdamW(rest, lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    sgd = torch.optim.SGD(emb, lr=learning_rate * 10, momentum=0.9)
    return ddp_model, raw_model, [adamw, sgd]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)

    g = torch.Generator().manual_seed(seed)
    train_data = torch.randint(0, vocab_size, (20000,), generator=g)
    data_gen = torch.Generator().manual_seed(seed + 1 + rank)

    def get_batch():
        ix = torch.randint(len(train_data) - block_size - 1, (batch_size,), generator=data_gen)
        x = torch.stack([train_data[i:i + block_size] for i in ix])
        y = torch.stack([train_data[i + 1:i + 1 + block_size] for i in ix])
        return x, y

    def run(ddp_model, raw_model, optimizers, start, end, X, Y):
        base_lrs = [learning_rate, learning_rate * 10]
        for iter_num in range(start, end):
            scale = get_lr(iter_num) / learning_rate
            for opt, base in zip(optimizers, base_lrs):
                for group in opt.param_groups:
                    group["lr"] = base * scale
            for micro_step in range(gradient_accumulation_steps):
                ddp_model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
                _, loss = ddp_model(X, Y)
                loss = loss / gradient_accumulation_steps
                X, Y = get_batch()
                loss.backward()
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
            for opt in optimizers:
                opt.step()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
        return X, Y

    ddp_model, raw_model, optimizers = build(seed)
    X, Y = get_batch()
    X, Y = run(ddp_model, raw_model, optimizers, 0, stop_at, X, Y)

    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"rank{rank}.pt")
    torch.save({
        "model": raw_model.state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
        "iter_num": stop_at,
        "data_gen": data_gen.get_state(),
        "next_batch": (X, Y),
    }, path)
    dist.barrier()
    del ddp_model, raw_model, optimizers, X, Y

    # ---- resume into brand-new objects (different init, overwritten by the checkpoint)
    ckpt = torch.load(path, weights_only=False)
    ddp_model, raw_model, optimizers = build(seed + 999)
    raw_model.load_state_dict(ckpt["model"])
    for o, sd in zip(optimizers, ckpt["optimizers"]):
        o.load_state_dict(sd)
    data_gen.set_state(ckpt["data_gen"])
    X, Y = ckpt["next_batch"]
    run(ddp_model, raw_model, optimizers, ckpt["iter_num"], max_iters, X, Y)

    h = hashlib.sha256()
    for _, p in raw_model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
