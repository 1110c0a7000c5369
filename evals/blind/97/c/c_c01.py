"""minGPT-style char LM, hand loop on 2 DDP ranks, padded documents, checkpoint + resume.

Loss: token-level CE summed over the window, divided by the window's non-pad token count of
all ranks, times world size (DDP averages).  Each epoch has 11 micro-batches per rank and
grad_accum 3, so every epoch ends in a 2-micro-batch window (its own count, no rescaling).
Training stops after step 5, checkpoints, and resumes into freshly built objects.
"""
import contextlib
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, PAD, BLOCK = 40, 0, 16
N_LAYER, N_EMBD, N_HEAD = 2, 48, 4
MICRO_BS, GRAD_ACCUM, EPOCHS = 4, 3, 2
MICRO_PER_EPOCH = 11
LR, WARMUP, CLIP = 2e-3, 3, 0.5
STOP_AT = 5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(N_EMBD)
        self.attn = nn.MultiheadAttention(N_EMBD, N_HEAD, batch_first=True)
        self.ln2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(BLOCK, N_EMBD)
        self.blocks = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, idx):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T))
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        for b in self.blocks:
            x = b(x, mask)
        return self.lm_head(self.ln_f(x))


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(123 + 1000 * rank + epoch)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        x = torch.full((MICRO_BS, BLOCK + 1), PAD, dtype=torch.long)
        for r in range(MICRO_BS):
            n = int(torch.randint(3, BLOCK + 2, (1,), generator=g))
            x[r, :n] = torch.randint(1, VOCAB, (n,), generator=g)
        out.append((x[:, :-1], x[:, 1:]))
    return out


def windows(batches, k):
    for i in range(0, len(batches), k):
        yield batches[i:i + k]


def steps_per_epoch():
    return math.ceil(MICRO_PER_EPOCH / GRAD_ACCUM)


def build():
    torch.manual_seed(0)
    model = DDP(GPT())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    total = EPOCHS * steps_per_epoch()
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * s / total)))
    return model, opt, sched


def train(model, opt, sched, start_step, stop_at, world):
    step = 0
    for epoch in range(EPOCHS):
        for win in windows(epoch_batches(dist.get_rank(), epoch), GRAD_ACCUM):
            if step < start_step:
                step += 1
                continue
            if step >= stop_at:
                return step
            n_tok = torch.tensor(float(sum((y != PAD).sum().item() for _, y in win)))
            dist.all_reduce(n_tok)
            for i, (x, y) in enumerate(win):
                last = i == len(win) - 1
                with (model.no_sync() if not last else contextlib.nullcontext()):
                    logits = model(x)
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                           ignore_index=PAD, reduction="sum")
                    (loss * world / n_tok).backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
    return step


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt_dir = os.environ.get("CKPT_DIR") or tempfile.gettempdir()
    path = os.path.join(ckpt_dir, f"c_c01_ckpt_{os.getpid() if rank == 0 else 0}.pt")
    obj = [path]
    dist.broadcast_object_list(obj, src=0)
    path = obj[0]

    model, opt, sched = build()
    step = train(model, opt, sched, 0, STOP_AT, world)
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "step": step}, path)
    dist.barrier()
    del model, opt, sched

    model, opt, sched = build()
    ck = torch.load(path, weights_only=False)
    model.module.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    step = train(model, opt, sched, ck["step"], 10 ** 9, world)
    dist.barrier()
    if rank == 0:
        os.remove(path)
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"steps {step}")
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
