"""DDP + ZeroRedundancyOptimizer, two optimizers, no_sync accumulation, gradient_as_bucket_view.

- the backbone is optimised by a sharded AdamW (ZeroRedundancyOptimizer), the head by SGD
  with momentum; the input normalisation layer is frozen
- DDP(gradient_as_bucket_view=True); every micro-step but the window's last runs under no_sync
- an epoch is 8 micro-batches and K = 3: windows of 3, 3 and 2; each window's loss is the
  mean over the micro-batches it actually has
- after epoch 1 the trainer is rebuilt from a checkpoint (model, both optimizers, both
  schedulers), the ZeRO state consolidated on rank 0 first
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

SEED = 5
K = 3
MICRO_PER_EPOCH = 8
EPOCHS = 3
BS = 6
D = 20


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.Linear(D, D)  # fixed whitening, frozen
        self.backbone = nn.Sequential(nn.Linear(D, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.backbone(self.norm(x))).squeeze(-1)


def shard(rank):
    g = torch.Generator().manual_seed(SEED + 11 * rank)
    w = torch.randn(D, generator=torch.Generator().manual_seed(SEED))
    xs = torch.randn(EPOCHS * MICRO_PER_EPOCH, BS, D, generator=g)
    ys = (xs @ w > 0).float()
    return list(zip(xs, ys))


def build():
    torch.manual_seed(SEED)
    net = Net()
    net.norm.requires_grad_(False)
    model = DDP(net, gradient_as_bucket_view=True)
    body = ZeroRedundancyOptimizer(list(net.backbone.parameters()),
                                   optimizer_class=torch.optim.AdamW, lr=2e-3, weight_decay=0.01)
    head = torch.optim.SGD(net.head.parameters(), lr=0.05, momentum=0.9)
    scheds = [torch.optim.lr_scheduler.StepLR(body, step_size=4, gamma=0.5),
              torch.optim.lr_scheduler.StepLR(head, step_size=4, gamma=0.5)]
    return model, [body, head], scheds


def train_epoch(model, opts, scheds, data):
    crit = nn.BCEWithLogitsLoss()
    for start in range(0, len(data), K):
        window = data[start:start + K]
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            if last:
                loss = crit(model(x), y) / len(window)
                loss.backward()
            else:
                with model.no_sync():
                    loss = crit(model(x), y) / len(window)
                    loss.backward()
        for o in opts:
            o.step()
        for s in scheds:
            s.step()
        for o in opts:
            o.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt = f"/tmp/b_c03_{os.environ['MASTER_PORT']}.pt"
    data = shard(rank)
    model, opts, scheds = build()
    train_epoch(model, opts, scheds, data[:MICRO_PER_EPOCH])

    opts[0].consolidate_state_dict(to=0)
    if rank == 0:
        torch.save({"model": model.module.state_dict(),
                    "opts": [o.state_dict() for o in opts],
                    "scheds": [s.state_dict() for s in scheds]}, ckpt)
    dist.barrier()
    del model, opts, scheds

    model, opts, scheds = build()
    state = torch.load(ckpt, weights_only=False)
    model.module.load_state_dict(state["model"])
    for o, sd in zip(opts, state["opts"]):
        o.load_state_dict(sd)
    for s, sd in zip(scheds, state["scheds"]):
        s.load_state_dict(sd)
    for e in range(1, EPOCHS):
        train_epoch(model, opts, scheds, data[e * MICRO_PER_EPOCH:(e + 1) * MICRO_PER_EPOCH])

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        os.remove(ckpt)
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
