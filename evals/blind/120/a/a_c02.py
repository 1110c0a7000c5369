"""Token tagger sharded with FSDP2, deferred gradient sync inside each window.

Ranks see micro-batches of different sizes (rank 0: 4 rows, rank 1: 7 rows) with padded
positions; the loss of a window is the summed token loss over the window's all-ranks count
of real tokens, multiplied by W (FSDP2 averages over ranks). Each epoch has 10 micro-batches,
so windows are 4-4-2. Two optimizers: AdamW for the body, SGD with momentum for the head.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

CFG = dict(vocab=64, tags=6, dim=32, seq=10, accum=4, micro_per_epoch=10, epochs=2, seed=5)


class Tagger(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["dim"])
        self.enc = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(c["dim"]), nn.Linear(c["dim"], c["dim"]), nn.GELU()) for _ in range(2)
        )
        self.head = nn.Linear(c["dim"], c["tags"])

    def forward(self, tok):
        h = self.emb(tok)
        for layer in self.enc:
            h = h + layer(h)
        return self.head(h)


def make_epoch(c, rank, epoch):
    g = torch.Generator().manual_seed(c["seed"] * 1000 + epoch * 10 + rank)
    rows = 4 if rank == 0 else 7
    out = []
    for _ in range(c["micro_per_epoch"]):
        tok = torch.randint(1, c["vocab"], (rows, c["seq"]), generator=g)
        lens = torch.randint(3, c["seq"] + 1, (rows,), generator=g)
        mask = torch.arange(c["seq"])[None, :] < lens[:, None]
        tags = torch.where(mask, tok % c["tags"], torch.full_like(tok, -100))
        tok = torch.where(mask, tok, torch.zeros_like(tok))
        out.append((tok, tags))
    return out


def main():
    c = CFG
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(c["seed"])
    model = Tagger(c)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.enc:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    head_params = list(model.head.parameters())
    head_ids = {id(p) for p in head_params}
    body_params = [p for p in model.parameters() if id(p) not in head_ids]
    opts = [torch.optim.AdamW(body_params, lr=3e-3), torch.optim.SGD(head_params, lr=0.05, momentum=0.9)]

    K = c["accum"]
    for epoch in range(c["epochs"]):
        batches = make_epoch(c, rank, epoch)
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n_real = torch.tensor(float(sum((t != -100).sum().item() for _, t in window)))
            dist.all_reduce(n_real)
            for j, (tok, tags) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(tok)
                loss = F.cross_entropy(logits.reshape(-1, c["tags"]), tags.reshape(-1),
                                       ignore_index=-100, reduction="sum")
                (loss * world / n_real).backward()
            for o in opts:
                o.step()
            for o in opts:
                o.zero_grad(set_to_none=True)
            if rank == 0:
                print(f"epoch {epoch} window@{start} len {len(window)} tokens {int(n_real)}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
