"""minGPT-style causal LM trainer on padded documents, torchrun + DDP (gloo).

* windows of K=3 micro-batches; an epoch has 7 micro-batches per rank, so every epoch
  ends in a 1-micro-batch window;
* the loss of a window is the sum of token cross-entropies over the window's
  all-ranks count of real (non-pad) tokens; DDP's mean over ranks is undone by x W;
* weights EMA after every optimizer step;
* the run is interrupted after optimizer step 4 (mid-epoch), checkpointed, and resumed
  into freshly built objects that skip the already consumed micro-batches.
"""
import argparse
import hashlib
import math
import os
import tempfile
from contextlib import nullcontext
from itertools import islice

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

PAD = 0


class GPTConfig:
    vocab_size = 48
    block_size = 20
    n_layer = 2
    n_head = 2
    n_embd = 32
    # training
    micro_batch = 3
    grad_accum = 3
    epochs = 3
    lr = 3e-3
    betas = (0.9, 0.95)
    weight_decay = 0.1
    warmup = 2
    ema_decay = 0.9
    stop_after = 4
    seed = 11


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for b in self.blocks:
            x = b(x, mask)
        return self.lm_head(self.ln_f(x))


class Documents(Dataset):
    def __init__(self, n, c, seed):
        g = torch.Generator().manual_seed(seed)
        self.docs = []
        for _ in range(n):
            L = int(torch.randint(5, c.block_size + 1, (1,), generator=g))
            base = torch.randint(1, c.vocab_size, (1,), generator=g)
            steps = torch.randint(1, 4, (L,), generator=g)
            self.docs.append((base + steps.cumsum(0)) % (c.vocab_size - 1) + 1)

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        return self.docs[i]


def pad_collate(docs):
    T = max(len(d) for d in docs)
    x = torch.full((len(docs), T), PAD, dtype=torch.long)
    for i, d in enumerate(docs):
        x[i, : len(d)] = d
    inp, tgt = x[:, :-1], x[:, 1:].clone()
    tgt[tgt == PAD] = -100
    return inp, tgt


class Trainer:
    def __init__(self, c, ckpt=None):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c.seed)
        raw = GPT(c)
        self.ema = {k: v.detach().clone() for k, v in raw.state_dict().items()}
        self.model = DDP(raw)
        decay = [p for n, p in raw.named_parameters() if p.dim() >= 2 and "wpe" not in n]
        other = [p for n, p in raw.named_parameters() if not (p.dim() >= 2 and "wpe" not in n)]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                                      {"params": other, "weight_decay": 0.0}], lr=c.lr, betas=c.betas)
        self.ds = Documents(42, c, c.seed)
        self.sampler = DistributedSampler(self.ds, shuffle=True, seed=c.seed)
        self.loader = DataLoader(self.ds, batch_size=c.micro_batch, sampler=self.sampler, collate_fn=pad_collate)
        self.windows_per_epoch = math.ceil(len(self.loader) / c.grad_accum)
        total = self.windows_per_epoch * c.epochs
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: min(1.0, (s + 1) / c.warmup) * max(0.1, 1 - s / total))
        self.step, self.epoch, self.consumed = 0, 0, 0
        if ckpt is not None:
            self.load(ckpt)

    # -- hooks ------------------------------------------------------------
    def before_window(self, window):
        n = torch.tensor(float(sum((t != -100).sum() for _, t in window)))
        dist.all_reduce(n)
        self.window_tokens = n

    def micro_step(self, batch, last):
        inp, tgt = batch
        with (nullcontext() if last else self.model.no_sync()):
            logits = self.model(inp)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                                   ignore_index=-100, reduction="sum")
            (loss * self.world / self.window_tokens).backward()
        return loss.item()

    def after_window(self):
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        with torch.no_grad():
            for k, v in self.model.module.state_dict().items():
                if v.dtype.is_floating_point:
                    self.ema[k].mul_(self.c.ema_decay).add_(v, alpha=1 - self.c.ema_decay)
                else:
                    self.ema[k].copy_(v)

    # -- checkpointing ----------------------------------------------------
    def save(self, path):
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                        "sched": self.sched.state_dict(), "ema": self.ema, "step": self.step,
                        "epoch": self.epoch, "consumed": self.consumed}, path)
        dist.barrier()

    def load(self, path):
        sd = torch.load(path, weights_only=False)
        self.model.module.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])
        self.sched.load_state_dict(sd["sched"])
        self.ema = sd["ema"]
        self.step, self.epoch, self.consumed = sd["step"], sd["epoch"], sd["consumed"]

    # -- loop ---------------------------------------------------------------
    def fit(self, stop_after=None):
        K = self.c.grad_accum
        while self.epoch < self.c.epochs:
            self.sampler.set_epoch(self.epoch)
            it = islice(iter(self.loader), self.consumed, None)
            while True:
                window = list(islice(it, K))
                if not window:
                    break
                self.before_window(window)
                for j, b in enumerate(window):
                    self.micro_step(b, last=j == len(window) - 1)
                self.consumed += len(window)
                self.after_window()
                if stop_after is not None and self.step == stop_after:
                    return False
            self.epoch += 1
            self.consumed = 0
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", default=None)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    c = GPTConfig()
    tmp = args.ckpt_dir or tempfile.gettempdir()
    path = os.path.join(tmp, f"c_c01_ckpt_{os.environ.get('MASTER_PORT', '0')}.pt")

    first = Trainer(c)
    done = first.fit(stop_after=c.stop_after)
    assert not done
    first.save(path)
    del first

    resumed = Trainer(c, ckpt=path)
    resumed.fit()
    if resumed.rank == 0:
        print(f"resumed run finished at step {resumed.step}", flush=True)
        h = hashlib.sha256()
        for _, p in resumed.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        os.remove(path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
