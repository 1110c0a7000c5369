"""Accelerate: a shared encoder and a task head prepared as two models with two optimizers.

Only the encoder (the expensive all-reduce) is put under `accumulate()`; the tiny head is
left to synchronise every micro-batch. A worker DataLoader feeds the loop, the clip acts on
sync steps only.
"""
import hashlib
import os

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset

K = 3
EPOCHS = 2
MAX_NORM = 0.25


class Seqs(Dataset):
    def __init__(self, n=144, t=10, vocab=40, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, t), generator=g)
        self.y = (self.x[:, :3].sum(-1) % 4)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Encoder(nn.Module):
    def __init__(self, vocab=40, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return h.mean(1)


def main():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    set_seed(11)
    enc, head = Encoder(), nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt_e = torch.optim.AdamW(enc.parameters(), lr=3e-3, weight_decay=0.01)
    opt_h = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(Seqs(), batch_size=4, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(11))
    enc, head, opt_e, opt_h, loader = acc.prepare(enc, head, opt_e, opt_h, loader)
    ce = nn.CrossEntropyLoss()
    for _ in range(EPOCHS):
        for x, y in loader:
            with acc.accumulate(enc):
                loss = ce(head(enc(x)), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(list(enc.parameters()) + list(head.parameters()), MAX_NORM)
                opt_e.step()
                opt_h.step()
                opt_e.zero_grad()
                opt_h.zero_grad()
    if acc.is_main_process:
        h = hashlib.sha256()
        named = list(acc.unwrap_model(enc).named_parameters()) + list(acc.unwrap_model(head).named_parameters())
        for _, p in named:
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    acc.end_training()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
