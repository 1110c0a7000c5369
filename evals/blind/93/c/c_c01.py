"""nanoGPT-style char LM on padded documents, 2 DDP ranks (torchrun).

Token-level loss over the window's valid tokens on all ranks (x W, since DDP
averages).  10 micro-batches per epoch with K = 4 -> windows of 4, 4 and 2.
After the first epoch the run is checkpointed and resumed into fresh objects.
"""
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

vocab_size = 48
block_size = 16
n_embd = 32
batch_size = 4
gradient_accumulation_steps = 4
micro_batches_per_epoch = 10
epochs = 2
learning_rate = 3e-3
grad_clip = 0.5
PAD = -100


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.register_buffer("causal", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.causal[:T, :T])
        logits = self.lm_head(self.ln_f(x))
        # summed token loss; the caller normalises
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1), ignore_index=PAD, reduction="sum")


def epoch_batches(epoch, rank):
    g = torch.Generator().manual_seed(10_000 * epoch + rank)
    out = []
    for _ in range(micro_batches_per_epoch):
        x = torch.randint(1, vocab_size, (batch_size, block_size + 1), generator=g)
        x[:, 1:] = (x[:, :-1] * 7 + 3) % vocab_size if torch.rand((), generator=g) < 0.5 else x[:, 1:]
        lengths = torch.randint(3, block_size + 1, (batch_size,), generator=g)
        y = x[:, 1:].clone()
        y[torch.arange(block_size)[None, :] >= lengths[:, None]] = PAD
        out.append((x[:, :-1].contiguous(), y))
    return out


def get_lr_lambda(total_steps, warmup=2):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))
    return f


def build():
    torch.manual_seed(1337)
    raw = GPT()
    model = DDP(raw)
    decay = [p for n, p in raw.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in raw.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=(0.9, 0.95))
    steps_per_epoch = math.ceil(micro_batches_per_epoch / gradient_accumulation_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, get_lr_lambda(steps_per_epoch * epochs))
    return raw, model, optimizer, scheduler


def run_epoch(epoch, raw, model, optimizer, scheduler, world):
    batches = epoch_batches(epoch, dist.get_rank())
    for w0 in range(0, len(batches), gradient_accumulation_steps):
        window = batches[w0:w0 + gradient_accumulation_steps]
        n_tok = torch.tensor(float(sum(int((y != PAD).sum()) for _, y in window)))
        dist.all_reduce(n_tok)
        for micro_step, (x, y) in enumerate(window):
            model.require_backward_grad_sync = micro_step == len(window) - 1
            loss = model(x, y) * world / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    if dist.get_rank() == 0:
        print(f"epoch {epoch} last loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}", flush=True)


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_path = os.path.join(tempfile.gettempdir(), f"c_c01_ckpt_r{rank}_{os.getpid()}.pt")

    raw, model, optimizer, scheduler = build()
    run_epoch(0, raw, model, optimizer, scheduler, world)
    torch.save({"model": raw.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": 1}, ckpt_path)
    del raw, model, optimizer, scheduler

    raw, model, optimizer, scheduler = build()
    ckpt = torch.load(ckpt_path)
    raw.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    os.remove(ckpt_path)
    for epoch in range(ckpt["epoch"], epochs):
        run_epoch(epoch, raw, model, optimizer, scheduler, world)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in raw.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
