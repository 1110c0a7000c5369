"""Accelerate, bf16 autocast, two optimizers (AdamW body, SGD head), frozen embedding, K=2."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Cfg:
    vocab: int = 64
    dim: int = 32
    classes: int = 6
    k: int = 2
    micro_bs: int = 4
    epochs: int = 3
    body_lr: float = 2e-3
    head_lr: float = 5e-2


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.emb.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(c.dim, 64), nn.Tanh(), nn.Linear(64, c.dim))
        self.head = nn.Linear(c.dim, c.classes)

    def forward(self, x):
        return self.head(self.body(self.emb(x).mean(1)))


def main():
    c = Cfg()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=c.k, mixed_precision="bf16")
    assert acc.num_processes == 2
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, c.vocab, (64, 10), generator=g)
    y = (x[:, 0] + x[:, 1]) % c.classes
    dl = DataLoader(TensorDataset(x, y), batch_size=c.micro_bs, shuffle=True,
                    generator=torch.Generator().manual_seed(1))  # 8 micro-batches per rank -> 4 windows
    net = Net(c)
    opt_body = torch.optim.AdamW(net.body.parameters(), lr=c.body_lr)
    opt_head = torch.optim.SGD(net.head.parameters(), lr=c.head_lr, momentum=0.9)
    net, opt_body, opt_head, dl = acc.prepare(net, opt_body, opt_head, dl)

    for _ in range(c.epochs):
        for xb, yb in dl:
            with acc.accumulate(net):
                with acc.autocast():
                    logits = net(xb)
                loss = F.cross_entropy(logits.float(), yb)
                acc.backward(loss)
                opt_body.step()
                opt_head.step()
                opt_body.zero_grad()
                opt_head.zero_grad()

    if acc.is_main_process:
        m = acc.unwrap_model(net)
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
