# ZeRO-2 regression trainer: the loop owns the accumulation boundary so that each
# epoch's tail (epoch length not a multiple of K) still ends in an optimizer step.
import argparse, hashlib, os
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--micro_bs", type=int, default=8)
p.add_argument("--batches_per_epoch", type=int, default=10)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--lr", type=float, default=3e-3)
args = p.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, 4)

    def forward(self, x, y):
        return F.mse_loss(self.head(self.body(x)), y)


model = Regressor()
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
ds_config = {
    "train_micro_batch_size_per_gpu": args.micro_bs,
    "gradient_accumulation_steps": args.accum,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)

g = torch.Generator().manual_seed(1234)
N = args.batches_per_epoch * args.micro_bs * world
X = torch.randn(N, 16, generator=g)
W_true = torch.randn(16, 4, generator=g)
Y = torch.tanh(X @ W_true) + 0.1 * torch.randn(N, 4, generator=g)


def epoch_batches(epoch):
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(100 + epoch))
    shard = perm[rank::world]
    for b in range(args.batches_per_epoch):
        idx = shard[b * args.micro_bs:(b + 1) * args.micro_bs]
        yield X[idx], Y[idx]


K = args.accum
for epoch in range(args.epochs):
    nb = args.batches_per_epoch
    for i, (x, y) in enumerate(epoch_batches(epoch)):
        boundary = (i + 1) % K == 0 or (i + 1) == nb
        engine.set_gradient_accumulation_boundary(boundary)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

flat = []
for n, prm in engine.module.named_parameters():
    flat.append(prm.detach().float().cpu().numpy().tobytes())
if rank == 0:
    print("FINAL_SHA256", hashlib.sha256(b"".join(flat)).hexdigest(), flush=True)
dist.barrier()
