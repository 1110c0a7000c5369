"""nanoGPT-style DDP run with masked (prompt) targets, bf16 autocast, 3-3-2
windows per epoch, each window normalised by its all-ranks target-token
count, and a stop/resume halfway into fresh objects.
"""
import hashlib
import math
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

vocab_size, block_size, n_embd, n_head, n_layer = 40, 12, 32, 2, 2
batch_size = 4
rows_per_rank = 30            # 8 micro-batches per epoch: 4 x 7 + 2
gradient_accumulation_steps = 3   # windows of 3, 3, 2
epochs = 6
resume_after_epoch = 3
learning_rate, min_lr, warmup_iters = 2e-3, 2e-4, 3
weight_decay, grad_clip = 0.1, 1.0
seed = 99


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def get_lr(it, max_iters):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    r = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (learning_rate - min_lr)


def build(ckpt=None):
    model = GPT()
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    ddp = DDP(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=learning_rate, betas=(0.9, 0.95))
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
    return model, ddp, opt


def make_loader(rank):
    g = torch.Generator().manual_seed(seed + 101 * rank)
    start = torch.randint(0, vocab_size, (rows_per_rank, 1), generator=g)
    seq = (start * 3 + torch.arange(block_size + 1) ** 2) % vocab_size
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    # mask a random-length "prompt" on each row: uneven target counts
    prompt_len = torch.randint(1, block_size - 2, (rows_per_rank,), generator=g)
    y[torch.arange(block_size)[None, :] < prompt_len[:, None]] = -1
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def run_epochs(ddp, opt, loader, iter_num, first_epoch, last_epoch, world, rank):
    max_iters = epochs * math.ceil(len(loader) / gradient_accumulation_steps)
    for epoch in range(first_epoch, last_epoch):
        for window in windows(loader, gradient_accumulation_steps):
            n_tok = torch.tensor(float(sum(int((y != -1).sum()) for _, y in window)))
            dist.all_reduce(n_tok)                      # all ranks' target tokens in this window
            lr = get_lr(iter_num, max_iters)
            for grp in opt.param_groups:
                grp["lr"] = lr
            for i, (x, y) in enumerate(window):
                ddp.require_backward_grad_sync = i == len(window) - 1
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = ddp(x)
                loss = F.cross_entropy(logits.float().view(-1, vocab_size), y.view(-1),
                                       ignore_index=-1, reduction="sum")
                (loss * world / n_tok).backward()      # DDP averages over ranks
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rank == 0 and iter_num % 6 == 0:
                print(f"iter {iter_num} lr {lr:.2e} loss {loss.item() / max(1, int((y != -1).sum())):.4f}")
            iter_num += 1
    return iter_num


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    loader = make_loader(rank)

    model, ddp, opt = build()
    iter_num = run_epochs(ddp, opt, loader, 0, 0, resume_after_epoch, world, rank)

    # --- checkpoint, drop everything, resume into fresh objects ---
    ckdir = [tempfile.mkdtemp(prefix="c_c02_") if rank == 0 else None]
    dist.broadcast_object_list(ckdir)
    path = os.path.join(ckdir[0], "ckpt.pt")
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "iter_num": iter_num, "epoch": resume_after_epoch}, path)
    dist.barrier()
    del model, ddp, opt
    torch.manual_seed(seed + 1)     # fresh init is overwritten by the checkpoint
    ckpt = torch.load(path, weights_only=False)
    model, ddp, opt = build(ckpt)
    iter_num = run_epochs(ddp, opt, loader, ckpt["iter_num"], ckpt["epoch"], epochs, world, rank)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckdir[0], ignore_errors=True)
        print(f"optimizer steps {iter_num}")
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
