"""DDP with a worker DataLoader (DistributedSampler), two optimizers (SGD for
the embedding, AdamW for the rest), no_sync over the first K-1 micro-batches,
and a checkpoint at a step boundary restored into freshly built objects."""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

K, MICRO, STEPS, STOP_AT = 2, 4, 12, 7
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_b_c03.pt")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.mix = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3))

    def forward(self, ids):
        return self.mix(self.emb(ids).mean(1))


def dataset(world):
    g = torch.Generator().manual_seed(9)
    n = STEPS * K * MICRO * world
    ids = torch.randint(0, 50, (n, 7), generator=g)
    return TensorDataset(ids, ids.sum(1) % 3)


def build():
    torch.manual_seed(21)
    model = DDP(Model())
    emb_opt = torch.optim.SGD(model.module.emb.parameters(), lr=0.2, momentum=0.8)
    rest_opt = torch.optim.AdamW(model.module.mix.parameters(), lr=5e-3)
    return model, [emb_opt, rest_opt]


def train(model, opts, loader, start_step, stop_step, rank):
    it = iter(loader)
    for _ in range(start_step * K):  # skip what was consumed before the checkpoint
        next(it)
    for step in range(start_step, stop_step):
        for k in range(K):
            ids, y = next(it)
            ctx = model.no_sync() if k < K - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.cross_entropy(model(ids), y) / K
                loss.backward()
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step + 1} loss {loss.item() * K:.4f}", flush=True)
    return stop_step


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    ds = dataset(world)
    sampler = DistributedSampler(ds, shuffle=True, seed=4)
    loader = DataLoader(ds, batch_size=MICRO, sampler=sampler, num_workers=1)

    model, opts = build()
    done = train(model, opts, loader, 0, STOP_AT, rank)
    if rank == 0:
        torch.save({"step": done, "model": model.module.state_dict(),
                    "opts": [o.state_dict() for o in opts]}, CKPT)
    dist.barrier()
    del model, opts

    model, opts = build()
    ck = torch.load(CKPT)
    model.module.load_state_dict(ck["model"])
    for o, s in zip(opts, ck["opts"]):
        o.load_state_dict(s)
    train(model, opts, loader, ck["step"], STEPS, rank)

    fulls = list(model.module.named_parameters())
    if rank == 0:
        h = hashlib.sha256()
        for _, t in fulls:
            h.update(t.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(CKPT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
