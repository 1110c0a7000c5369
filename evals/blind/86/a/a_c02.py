"""Logit distillation from a frozen teacher with Accelerate (sync every micro-batch, clip, prepared schedule).

Launch: torchrun --nproc-per-node 2 ... a_c02.py
"""
import hashlib
import math
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, Dataset

CFG = SimpleNamespace(dim=20, n_cls=8, n=240, micro_bs=10, accum=3, epochs=2,
                      lr=2e-3, warmup=2, clip=0.3, temp=2.0, alpha=0.7, seed=5)


class Points(Dataset):
    def __init__(self, n, dim, n_cls, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, n_cls, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def mlp(dim, hidden, n_cls, depth):
    layers, d = [], dim
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.SiLU()]
        d = hidden
    return nn.Sequential(*layers, nn.Linear(d, n_cls))


def warmup_cosine(total, warmup):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return f


def distill_loss(s_logits, t_logits, labels, temp, alpha):
    kd = F.kl_div(F.log_softmax(s_logits / temp, -1), F.log_softmax(t_logits / temp, -1),
                  log_target=True, reduction="batchmean") * temp * temp
    ce = F.cross_entropy(s_logits, labels)
    return alpha * kd + (1 - alpha) * ce


def main():
    c = CFG
    plugin = GradientAccumulationPlugin(num_steps=c.accum, sync_each_batch=True)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    set_seed(c.seed)
    torch.use_deterministic_algorithms(True)
    teacher = mlp(c.dim, 64, c.n_cls, 3).eval().requires_grad_(False)
    student = mlp(c.dim, 24, c.n_cls, 2)
    opt = torch.optim.AdamW(student.parameters(), lr=c.lr, weight_decay=0.0)
    loader = DataLoader(Points(c.n, c.dim, c.n_cls, c.seed), batch_size=c.micro_bs, shuffle=True,
                        num_workers=1, generator=torch.Generator().manual_seed(c.seed))
    per_rank_batches = len(loader) // acc.num_processes
    opt_steps = c.epochs * per_rank_batches // c.accum
    # a prepared scheduler advances once per process on every real optimizer step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(opt_steps * acc.num_processes,
                                                                 c.warmup * acc.num_processes))
    student, opt, loader, sched = acc.prepare(student, opt, loader, sched)
    teacher = teacher.to(acc.device)

    n_steps = 0
    for epoch in range(c.epochs):
        student.train()
        for x, y in loader:
            with acc.accumulate(student):
                with torch.no_grad():
                    t_logits = teacher(x)
                loss = distill_loss(student(x), t_logits, y, c.temp, c.alpha)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(student.parameters(), c.clip)
                    n_steps += 1
                opt.step()
                sched.step()
                opt.zero_grad()

    if acc.is_main_process:
        print(f"optimizer steps: {n_steps} (planned {opt_steps}), last lr {sched.get_last_lr()[0]:.2e}")
        h = hashlib.sha256()
        for _, p in acc.unwrap_model(student).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
