"""Knowledge distillation with Lightning Fabric (DDP, 2 ranks launched by Fabric
itself). A frozen teacher, a student whose input LayerNorm is frozen, two
optimizers (AdamW for the body, SGD with Nesterov momentum for the head), a
per-optimizer norm clip once per step, and ranks drawing micro-batches of
different sizes (3 and 5 samples). The window loss is the mean over all samples
of the window on all ranks: sum(loss) * W / all-ranks window count.

Launch: python c_c03.py
"""
import hashlib
import os

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "49219")

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


class Config:
    in_dim = 16
    n_classes = 6
    grad_accum = 2
    steps = 12
    temperature = 2.0
    alpha = 0.7
    lr_body = 2e-3
    lr_head = 5e-2
    max_norm = 0.5
    batch_size_per_rank = (3, 5)


def make_teacher(cfg):
    torch.manual_seed(100)
    t = nn.Sequential(nn.Linear(cfg.in_dim, 64), nn.ReLU(), nn.Linear(64, cfg.n_classes))
    for p in t.parameters():
        p.requires_grad_(False)
    return t.eval()


class Student(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.in_dim)
        self.norm.requires_grad_(False)                 # frozen input normalisation
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU())
        self.head = nn.Linear(24, cfg.n_classes)

    def forward(self, x):
        return self.head(self.body(self.norm(x)))


def distill_loss_sum(s_logits, t_logits, labels, cfg):
    T = cfg.temperature
    kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1), log_target=True, reduction="none").sum(-1) * T * T
    ce = F.cross_entropy(s_logits, labels, reduction="none")
    return (cfg.alpha * kd + (1 - cfg.alpha) * ce).sum()


def main():
    cfg = Config()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(21)
    W, K = fabric.world_size, cfg.grad_accum

    teacher = make_teacher(cfg)
    torch.manual_seed(21)
    student = Student(cfg)
    opt_body = torch.optim.AdamW(student.body.parameters(), lr=cfg.lr_body, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=cfg.lr_head, momentum=0.9, nesterov=True)
    student, opt_body, opt_head = fabric.setup(student, opt_body, opt_head)

    bs = cfg.batch_size_per_rank[fabric.global_rank]
    gen = torch.Generator().manual_seed(500 + fabric.global_rank)

    def next_micro_batch():
        x = torch.randn(bs, cfg.in_dim, generator=gen)
        labels = torch.randint(0, cfg.n_classes, (bs,), generator=gen)
        return x, labels

    for step in range(cfg.steps):
        window = [next_micro_batch() for _ in range(K)]
        n_global = fabric.all_reduce(torch.tensor(float(sum(x.size(0) for x, _ in window))), reduce_op="sum")
        for k, (x, labels) in enumerate(window):
            with fabric.no_backward_sync(student, enabled=(k != K - 1)):
                with torch.no_grad():
                    t_logits = teacher(x)
                s_logits = student(x)
                loss = distill_loss_sum(s_logits, t_logits, labels, cfg) * W / n_global
                fabric.backward(loss)
        fabric.clip_gradients(student, opt_body, max_norm=cfg.max_norm)
        fabric.clip_gradients(student, opt_head, max_norm=cfg.max_norm)
        opt_body.step()
        opt_head.step()
        opt_body.zero_grad()
        opt_head.zero_grad()

    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in student.module.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
