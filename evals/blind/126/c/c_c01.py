"""nanoGPT-flavoured training on padded documents, DDP on 2 self-spawned ranks.

- each rank's epoch has 8 micro-batches and GRAD_ACCUM = 3, so every epoch runs
  windows of 3, 3 and 2 micro-batches (the short tail is stepped, not carried);
- a window is read ahead, its real-token count summed over the ranks, and every
  micro-batch contributes sum(token CE) * world / window_tokens (DDP averages);
- the global-norm clip runs once per window, after the last backward;
- after 4 optimizer steps the run checkpoints, throws every object away and
  resumes into a freshly built model / optimizer (same as a pre-empted job).
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

PORT = 49211
WORLD = 2
VOCAB, BLOCK, D, PAD = 48, 24, 32, 0
MICRO_BSZ, MICROS_PER_EPOCH, GRAD_ACCUM, EPOCHS = 2, 8, 3, 3
LR, MIN_LR, WARMUP, GRAD_CLIP, WD = 6e-3, 6e-4, 2, 0.3, 0.1
STOP_AFTER = 4  # optimizer steps before the simulated pre-emption


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(BLOCK, D)
        layer = nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.h = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(BLOCK), persistent=False)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        x = self.ln_f(self.h(x, mask=self.causal[:t, :t], is_causal=True))
        logits = self.lm_head(x)
        # summed token loss; the caller normalises by the window's token count
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-1, reduction="sum")

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.named_parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95))


def documents(rank):
    """Padded documents of random length, different on each rank."""
    g = torch.Generator().manual_seed(500 + rank)
    n = MICRO_BSZ * MICROS_PER_EPOCH
    lengths = torch.randint(6, BLOCK + 2, (n,), generator=g)
    xs, ys = torch.full((n, BLOCK), PAD), torch.full((n, BLOCK), -1)
    for i, L in enumerate(lengths.tolist()):
        L = min(L, BLOCK + 1)
        doc = torch.randint(1, VOCAB, (L,), generator=g)
        xs[i, : L - 1], ys[i, : L - 1] = doc[:-1], doc[1:]
    return xs, ys


def windows(xs, ys):
    micro = [(xs[i : i + MICRO_BSZ], ys[i : i + MICRO_BSZ]) for i in range(0, len(xs), MICRO_BSZ)]
    for s in range(0, len(micro), GRAD_ACCUM):
        yield micro[s : s + GRAD_ACCUM]


def get_lr(it, total):
    if it < WARMUP:
        return LR * (it + 1) / WARMUP
    ratio = (it - WARMUP) / max(1, total - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def build():
    torch.manual_seed(1337)
    raw = TinyGPT()
    model = DDP(raw)
    return raw, model, raw.configure_optimizers()


def worker(rank, ckpt_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=WORLD)
    xs, ys = documents(rank)
    steps_per_epoch = math.ceil(MICROS_PER_EPOCH / GRAD_ACCUM)
    total_steps = EPOCHS * steps_per_epoch
    ckpt = os.path.join(ckpt_dir, "ckpt.pt")

    raw, model, opt = build()
    iter_num = 0
    for phase in ("first", "resumed"):
        if phase == "resumed":
            del raw, model, opt
            raw, model, opt = build()  # brand new objects, different init is overwritten
            state = torch.load(ckpt, map_location="cpu")
            raw.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            iter_num = state["iter_num"]
        for epoch in range(EPOCHS):
            for w_idx, window in enumerate(windows(xs, ys)):
                step = epoch * steps_per_epoch + w_idx
                if step < iter_num:
                    continue  # already done before the pre-emption
                if phase == "first" and iter_num >= STOP_AFTER:
                    break
                n_tok = torch.tensor(float(sum(int((y != -1).sum()) for _, y in window)))
                dist.all_reduce(n_tok, op=dist.ReduceOp.SUM)
                lr = get_lr(iter_num, total_steps)
                for g in opt.param_groups:
                    g["lr"] = lr
                for m, (x, y) in enumerate(window):
                    model.require_backward_grad_sync = m == len(window) - 1
                    loss = model(x, y) * WORLD / n_tok
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(raw.parameters(), GRAD_CLIP)
                opt.step()
                opt.zero_grad(set_to_none=True)
                iter_num += 1
        if phase == "first":
            if rank == 0:
                torch.save({"model": raw.state_dict(), "optimizer": opt.state_dict(), "iter_num": iter_num}, ckpt)
            dist.barrier()

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in raw.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(d,), nprocs=WORLD, join=True)
