"""Next-token model trained with Lightning Fabric on 2 ranks.

Variable-length sequences (padding labelled -100), a token-level loss normalised over the
whole window across ranks, a body and a head with separate optimizers, a clip on the
accumulated gradient, and an epoch whose last window is shorter.
"""
import hashlib

import torch
import torch.nn as nn
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy
from torch.utils.data import DataLoader, Dataset

VOCAB, SEQ, K, EPOCHS, BS = 32, 8, 4, 2, 4
IGNORE = -100


class Packed(Dataset):
    def __init__(self, n=112, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.tok = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
        self.len = torch.randint(2, SEQ + 1, (n,), generator=g)

    def __len__(self):
        return len(self.tok)

    def __getitem__(self, i):
        x = self.tok[i, :-1].clone()
        y = self.tok[i, 1:].clone()
        y[self.len[i]:] = IGNORE
        return x, y


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mix = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        h = h + torch.cumsum(h, dim=1) / torch.arange(1, x.size(1) + 1).view(1, -1, 1)
        return self.head(self.mix(h))


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"))
    fabric.launch()
    assert fabric.world_size == 2
    fabric.seed_everything(5)

    model = TinyLM()
    body_params = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    opt_body = torch.optim.AdamW(body_params, lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    model, opt_body, opt_head = fabric.setup(model, opt_body, opt_head)
    loader = fabric.setup_dataloaders(DataLoader(Packed(), batch_size=BS, shuffle=False))

    for epoch in range(EPOCHS):
        for win in windows(loader, K):
            local = sum((y != IGNORE).sum() for _, y in win).float()
            # mean over ranks = all-ranks count / W, which cancels DDP's gradient average
            denom = fabric.all_reduce(local, reduce_op="mean")
            for j, (x, y) in enumerate(win):
                last = j == len(win) - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    logits = model(x)
                    loss = nn.functional.cross_entropy(
                        logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE, reduction="sum") / denom
                    fabric.backward(loss)
            fabric.clip_gradients(model, opt_body, max_norm=0.15)
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad()
            opt_head.zero_grad()

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
