# Feature + logit distillation (timm/DeiT-flavoured) on 2 torchrun ranks: a frozen teacher run under
# bf16 autocast, a student wrapped in DDP together with a feature adapter that has its own SGD
# optimizer, a DataLoader with a worker process, no_sync on all but the last micro-batch.
import hashlib, os
from contextlib import nullcontext
from types import SimpleNamespace
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

cfg = SimpleNamespace(seed=3, n=384, in_dim=40, classes=8, micro_bs=12, accum=4, epochs=2,
                      lr_student=2e-3, lr_adapter=5e-2, tau=2.0, alpha=0.5, feat_w=0.1, clip=1.0)


class SynthSet(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(cfg.seed)
        self.x = torch.randn(cfg.n, cfg.in_dim, generator=g)
        self.y = (self.x[:, :cfg.classes] * 2 + torch.randn(cfg.n, cfg.classes, generator=g)).argmax(-1)

    def __len__(self):
        return cfg.n

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.in_dim, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, cfg.classes)

    def forward(self, x):
        f = self.body(x)
        return f, self.head(f)


class StudentWithAdapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.student = Net(24)
        self.adapter = nn.Linear(24, 64)  # maps student features to the teacher's width

    def forward(self, x):
        f, logits = self.student(x)
        return self.adapter(f), logits


def distill_loss(s_feat, s_logits, t_feat, t_logits, y):
    kd = F.kl_div(F.log_softmax(s_logits / cfg.tau, -1), F.log_softmax(t_logits / cfg.tau, -1),
                  reduction="batchmean", log_target=True) * cfg.tau ** 2
    ce = F.cross_entropy(s_logits, y)
    feat = F.mse_loss(s_feat, t_feat)
    return cfg.alpha * kd + (1 - cfg.alpha) * ce + cfg.feat_w * feat


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    teacher = Net(64).eval().requires_grad_(False)
    torch.manual_seed(cfg.seed + 1)
    model = StudentWithAdapter()
    ddp = DDP(model)
    opt_student = torch.optim.AdamW(model.student.parameters(), lr=cfg.lr_student, weight_decay=0.05)
    opt_adapter = torch.optim.SGD(model.adapter.parameters(), lr=cfg.lr_adapter, momentum=0.9)
    optimizers = [opt_student, opt_adapter]

    ds = SynthSet()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(ds, batch_size=cfg.micro_bs, sampler=sampler, num_workers=1, drop_last=True,
                        persistent_workers=False)
    steps_per_epoch = len(loader) // cfg.accum
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt_student, T_max=steps_per_epoch * cfg.epochs)

    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % cfg.accum == 0
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                t_feat, t_logits = teacher(x)
            with (nullcontext() if last else ddp.no_sync()):
                s_feat, s_logits = ddp(x)
                loss = distill_loss(s_feat, s_logits, t_feat.float(), t_logits.float(), y)
                (loss / cfg.accum).backward()
            if last:
                torch.nn.utils.clip_grad_norm_(model.student.parameters(), cfg.clip)
                for opt in optimizers:
                    opt.step()
                sched.step()
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
