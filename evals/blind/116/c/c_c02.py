"""nanoGPT-style training loop on 2 DDP ranks over ragged (padded) sequences.

Each rank sees 11 micro-batches per epoch; with gradient_accumulation_steps = 3 the
windows are 3, 3, 3 and a short 2. The loss of every window is the mean over all
valid target tokens of that window on all ranks: the window is read ahead, its
token count summed over ranks, and each micro-batch contributes sum(CE) * W / count.
The run is interrupted after the first epoch (checkpoint on disk) and resumed into
freshly built model/DDP/optimizer objects.

Launch: torchrun --nproc-per-node 2 c_c02.py
"""
import hashlib
import math
import os
import tempfile
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# config (nanoGPT style: module-level globals)
vocab_size = 48
block_size = 16
n_embd = 32
batch_size = 4
gradient_accumulation_steps = 3
micro_batches_per_epoch = 11
max_epochs = 3
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 2
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 0.5
seed = 1337
# -----------------------------------------------------------------------------

steps_per_epoch = math.ceil(micro_batches_per_epoch / gradient_accumulation_steps)
max_iters = steps_per_epoch * max_epochs
lr_decay_iters = max_iters


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.rnn = nn.GRU(n_embd, n_embd, batch_first=True)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight            # weight tying

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        h, _ = self.rnn(self.wte(idx) + self.wpe(pos))
        logits = self.lm_head(self.ln_f(h))
        return F.cross_entropy(logits.float().view(-1, vocab_size), targets.view(-1), ignore_index=-1, reduction="sum")


def get_batch(epoch, micro, rank):
    g = torch.Generator().manual_seed(seed + 7919 * epoch + 104729 * rank + micro)
    x = torch.randint(0, vocab_size, (batch_size, block_size + 1), generator=g)
    x[:, 1:] = (x[:, :-1] * 5 + 3) % vocab_size                  # learnable pattern
    lengths = torch.randint(4, block_size + 1, (batch_size,), generator=g)
    y = x[:, 1:].clone()
    y[torch.arange(block_size)[None, :] >= lengths[:, None]] = -1  # padding
    return x[:, :-1], y


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def build():
    torch.manual_seed(seed)
    raw = TinyLM()
    model = DDP(raw)
    optimizer = torch.optim.AdamW(raw.parameters(), lr=learning_rate, betas=(beta1, beta2), weight_decay=weight_decay)
    return raw, model, optimizer


def train_epochs(raw, model, optimizer, start_epoch, end_epoch, iter_num, rank, world):
    ctx = torch.autocast(device_type="cpu", dtype=torch.bfloat16)
    for epoch in range(start_epoch, end_epoch):
        for w_start in range(0, micro_batches_per_epoch, gradient_accumulation_steps):
            window = [get_batch(epoch, m, rank) for m in range(w_start, min(w_start + gradient_accumulation_steps, micro_batches_per_epoch))]
            n_tok = torch.tensor(sum(int((y >= 0).sum()) for _, y in window), dtype=torch.float64)
            dist.all_reduce(n_tok)
            lr = get_lr(iter_num)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for j, (X, Y) in enumerate(window):
                last = j == len(window) - 1
                with (nullcontext() if last else model.no_sync()):
                    with ctx:
                        loss = model(X, Y) * world / n_tok.item()
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1
    return iter_num


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_dir = os.path.join(tempfile.gettempdir(), f"c_c02_ckpt_{os.getpid() if rank == 0 else 0}")
    obj = [ckpt_dir]
    dist.broadcast_object_list(obj, src=0)
    ckpt_path = os.path.join(obj[0], "ckpt.pt")

    # first session: one epoch, then checkpoint and "preemption"
    raw, model, optimizer = build()
    iter_num = train_epochs(raw, model, optimizer, 0, 1, 0, rank, world)
    if rank == 0:
        os.makedirs(obj[0], exist_ok=True)
        torch.save({"model": raw.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num, "epoch": 1}, ckpt_path)
    dist.barrier()
    del raw, model, optimizer

    # second session: new objects, resume from disk
    raw, model, optimizer = build()
    ckpt = torch.load(ckpt_path, map_location="cpu")
    raw.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    train_epochs(raw, model, optimizer, ckpt["epoch"], max_epochs, ckpt["iter_num"], rank, world)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in raw.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
        os.remove(ckpt_path)
        os.rmdir(obj[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
