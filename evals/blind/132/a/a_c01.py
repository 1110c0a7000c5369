"""ZeRO-2 classifier trainer: frozen pretrained-style embedding, two AdamW
groups (no decay on norms/biases), clip 0.5, a linear warm-up owned by the
engine. An epoch is 8 micro-batches per rank and K = 3: the engine's window
counter runs on across epochs, so windows straddle epoch boundaries."""
import hashlib
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SETTINGS = dict(vocab=50, dim=32, classes=5, seq=10, samples=64, micro=4, ga=3,
                epochs=3, warmup=4, lr=4e-3, wd=0.05, clip=0.5, seed=99)


class BagClassifier(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed = nn.Embedding(s["vocab"], s["dim"])
        self.norm = nn.LayerNorm(s["dim"])
        self.proj = nn.Linear(s["dim"], s["dim"])
        self.cls = nn.Linear(s["dim"], s["classes"])

    def forward(self, ids, y):
        h = self.norm(self.embed(ids).mean(1))
        logits = self.cls(F.relu(self.proj(h)))
        return F.cross_entropy(logits, y)


def dataset(s):
    g = torch.Generator().manual_seed(s["seed"])
    ids = torch.randint(0, s["vocab"], (s["samples"], s["seq"]), generator=g)
    y = (ids[:, 0] + ids[:, -1]) % s["classes"]
    return TensorDataset(ids, y)


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def build(s, loader):
    torch.manual_seed(s["seed"])
    model = BagClassifier(s)
    model.embed.weight.requires_grad_(False)       # frozen
    opt = torch.optim.AdamW(param_groups(model, s["wd"]), lr=s["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / s["warmup"]))
    cfg = {
        "train_micro_batch_size_per_gpu": s["micro"],
        "gradient_accumulation_steps": s["ga"],
        "gradient_clipping": s["clip"],
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=cfg)
    return engine


def run_epochs(engine, sampler, loader, epochs):
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for ids, y in loader:
            loss = engine(ids, y)
            engine.backward(loss)
            engine.step()


def main():
    torch.use_deterministic_algorithms(True)
    s = SETTINGS
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = dataset(s)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=s["seed"])
    loader = DataLoader(ds, batch_size=s["micro"], sampler=sampler)
    engine = build(s, loader)
    run_epochs(engine, sampler, loader, s["epochs"])
    # 3 epochs x 8 micro-batches = 24 micro-batches = 8 full windows
    if rank == 0:
        print(f"global steps {engine.global_steps} lr {engine.get_lr()}", flush=True)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
