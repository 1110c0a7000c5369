"""Token-level SFT under Accelerate (CPU DDP) with hand-managed accumulation.

Windows are read ahead so the loss can be normalised by the window's
all-ranks count of label tokens; the sync is deferred with accelerator.no_sync
on all but the window's last micro-batch. Each epoch has 10 micro-batches per
rank and K = 4, so windows are 4-4-2. Gradient clipping at 0.5, a frozen
position table, and a warm-up LambdaLR prepared by Accelerate (it advances
num_processes times per optimizer step, so its horizon is in those units).
"""
import hashlib
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from accelerate import Accelerator
from accelerate.utils import set_seed

SEED, VOCAB, D, MAXLEN = 11, 80, 32, 14
MICRO_BS, K, EPOCHS, BATCHES_PER_RANK = 3, 4, 2, 10
LR, CLIP, IGNORE = 3e-3, 0.5, -100


class PromptCompletion(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(5, MAXLEN + 1, (1,), generator=g))
            p = int(torch.randint(2, L - 2, (1,), generator=g))
            ids = torch.randint(1, VOCAB, (L,), generator=g)
            labels = ids.clone()
            labels[:p] = IGNORE
            self.items.append((ids, labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    ids = torch.zeros(len(batch), MAXLEN, dtype=torch.long)
    labels = torch.full((len(batch), MAXLEN), IGNORE, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        ids[i, :len(x)] = x
        labels[i, :len(y)] = y
    return {"input_ids": ids, "labels": labels}


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.randn(MAXLEN, D) * 0.02, requires_grad=False)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, input_ids):
        h = self.tok(input_ids) + self.pos[: input_ids.shape[1]]
        h = h + self.ff(torch.cumsum(h, 1) / torch.arange(1, h.shape[1] + 1)[:, None])
        return self.head(h)


def shifted_ce_sum(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def windows(loader):
    it, buf = iter(loader), []
    for b in it:
        buf.append(b)
        if len(buf) == K:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    accelerator = Accelerator(cpu=True)
    set_seed(SEED)
    W = accelerator.num_processes
    data = PromptCompletion(MICRO_BS * BATCHES_PER_RANK * W, SEED)
    loader = DataLoader(data, batch_size=MICRO_BS, shuffle=False, collate_fn=collate)
    model = TinyLM()
    optimizer = torch.optim.AdamW([
        {"params": [model.tok.weight, model.head.weight], "weight_decay": 0.1},
        {"params": [p for n, p in model.named_parameters()
                    if p.requires_grad and n not in ("tok.weight", "head.weight")], "weight_decay": 0.0},
    ], lr=LR)
    steps_per_epoch = -(-BATCHES_PER_RANK // K)
    total = EPOCHS * steps_per_epoch
    warm = 2
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (warm * W)) * max(0.0, 1 - s / (total * W)))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    for epoch in range(EPOCHS):
        for win in windows(loader):
            n_local = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in win)
            n_all = accelerator.gather(torch.tensor([n_local])).sum().item()
            for i, batch in enumerate(win):
                ctx = accelerator.no_sync(model) if i < len(win) - 1 else nullcontext()
                with ctx:
                    loss = shifted_ce_sum(model(batch["input_ids"]), batch["labels"]) * W / n_all
                    accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.2e}")

    h = hashlib.sha256()
    for _, p in accelerator.unwrap_model(model).named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
