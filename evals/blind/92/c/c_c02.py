"""Logit distillation on 2 DDP ranks: frozen teacher, student with a frozen embedding,
two optimizers (AdamW for the body, SGD+momentum for the head), an EMA copy, a worker
DataLoader with uneven micro-batches, and a loss over the window's all-ranks sample count."""
import copy
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

cfg = SimpleNamespace(vocab=30, d_in=16, n_cls=10, accum=3, steps=10, tau=2.0, alpha=0.7,
                      lr_body=2e-3, lr_head=5e-2, ema=0.9, seed=11)
SIZES = [3, 5, 2, 6, 4, 3]  # micro-batch sizes, cycled; ranks are offset


class Synthetic(Dataset):
    def __init__(self, rank, n):
        g = torch.Generator().manual_seed(cfg.seed + rank)
        self.tok = torch.randint(0, cfg.vocab, (n, 6), generator=g)
        self.x = torch.randn(n, cfg.d_in, generator=g)
        self.y = torch.randint(0, cfg.n_cls, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.tok[i], self.x[i], self.y[i]


def uneven_batches(rank, n_micro):
    out, start = [], 0
    for i in range(n_micro):
        s = SIZES[(i + 2 * rank) % len(SIZES)]
        out.append(list(range(start, start + s)))
        start += s
    return out


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.emb = nn.EmbeddingBag(cfg.vocab, width, mode="mean")
        self.body = nn.Sequential(nn.Linear(width + cfg.d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, cfg.n_cls)

    def forward(self, tok, x):
        return self.head(self.body(torch.cat([self.emb(tok), x], dim=-1)))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    teacher = Net(64).eval().requires_grad_(False)
    student = Net(32)
    student.emb.weight.requires_grad_(False)
    ema = copy.deepcopy(student).requires_grad_(False)
    model = DDP(student)

    body_params = [p for n, p in student.named_parameters() if n.startswith("body")]
    opt_body = torch.optim.AdamW(body_params, lr=cfg.lr_body, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=cfg.lr_head, momentum=0.9)
    opts = [opt_body, opt_head]

    n_micro = cfg.steps * cfg.accum
    batches = uneven_batches(rank, n_micro)
    ds = Synthetic(rank, sum(len(b) for b in batches))
    loader = DataLoader(ds, batch_sampler=batches, num_workers=1)

    window = []
    for i, batch in enumerate(loader):
        window.append(batch)
        if len(window) < cfg.accum:
            continue
        n = torch.tensor(float(sum(b[2].numel() for b in window)))
        dist.all_reduce(n)
        for j, (tok, x, y) in enumerate(window):
            last = j == len(window) - 1
            with (model.no_sync() if not last else torch.enable_grad()):
                s_logits = model(tok, x)
                with torch.no_grad():
                    t_logits = teacher(tok, x)
                kd = F.kl_div(F.log_softmax(s_logits / cfg.tau, -1), F.log_softmax(t_logits / cfg.tau, -1),
                              log_target=True, reduction="sum") * cfg.tau ** 2
                ce = F.cross_entropy(s_logits, y, reduction="sum")
                loss = (cfg.alpha * kd + (1 - cfg.alpha) * ce) * world / n
                loss.backward()
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, ps in zip(ema.parameters(), student.parameters()):
                pe.lerp_(ps, 1 - cfg.ema)
        window = []
        if rank == 0 and (i + 1) % (3 * cfg.accum) == 0:
            print(f"micro {i + 1} loss {loss.item():.4f}", flush=True)
    assert not window

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
