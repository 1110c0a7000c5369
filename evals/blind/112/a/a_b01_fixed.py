"""Knowledge distillation on 2 DDP ranks: a frozen teacher, a small student,
gradient accumulation, SGDR (cosine with warm restarts) stepped per update."""
import argparse, hashlib, os
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--micro_bs", type=int, default=8)
p.add_argument("--grad_accum", type=int, default=4)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--T", type=float, default=2.0)
p.add_argument("--alpha", type=float, default=0.7)
args = p.parse_args()


def mlp(d_in, d_h, d_out):
    return nn.Sequential(nn.Linear(d_in, d_h), nn.GELU(), nn.Linear(d_h, d_h), nn.GELU(), nn.Linear(d_h, d_out))


def distill_loss(s_logits, t_logits, y, T, alpha):
    kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T * T
    ce = F.cross_entropy(s_logits, y)
    return alpha * kd + (1 - alpha) * ce


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    teacher = mlp(16, 64, 10).eval().requires_grad_(False)
    student = mlp(16, 24, 10)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(512, 16, generator=g)
    Y = teacher(X).argmax(-1)
    ds = TensorDataset(X, Y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.micro_bs, sampler=sampler, drop_last=True)
    K = args.grad_accum
    steps_per_epoch = len(loader) // K  # 32 micro-batches per rank -> 8 updates per epoch

    model = DDP(student)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # one restart per epoch: T_0 is measured in epochs, stepped with fractional epochs
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=1, eta_min=1e-5)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % K == 0
            ctx = model.no_sync() if not last else torch.enable_grad()
            with ctx:
                with torch.no_grad():
                    t_logits = teacher(x)
                loss = distill_loss(model(x), t_logits, y, args.T, args.alpha) / K
                loss.backward()
            if last:
                opt.step()
                opt.zero_grad(set_to_none=True)
                sched.step(epoch + (i + 1) / len(loader))
        if rank == 0:
            print(f"epoch {epoch} lr {opt.param_groups[0]['lr']:.5f} loss {loss.item() * K:.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, prm in student.named_parameters():
            h.update(prm.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
