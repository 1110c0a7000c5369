"""Token-level LM on FSDP2 with nested units (blocks + root), uneven micro-batches, a short last
window, loss summed and normalised by the window's all-ranks token count (x W, since FSDP2 averages),
and a global-norm clip on the DTensor gradients. Ranks are spawned by the script itself."""
import hashlib, os
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

V, D, T, K, WORLD, PORT = 40, 32, 12, 3, 2, 48108


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 64), nn.GELU(), nn.Linear(64, D))

    def forward(self, h):
        return h + self.ff(self.ln(h))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.out = nn.Linear(D, V)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def micro_batches(rank):
    """Per rank: 11 micro-batches (windows of 3, 3, 3, 2), 2-5 sequences each, padded labels = -100."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for i in range(11):
        n = 2 + (i + rank) % 4
        ids = torch.randint(0, V, (n, T), generator=g)
        lens = torch.randint(3, T + 1, (n,), generator=g)
        labels = ids.roll(-1, 1).clone()
        labels[torch.arange(T)[None, :] >= lens[:, None] - 1] = -100
        out.append((ids, labels))
    return out


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = TinyLM()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    data = micro_batches(rank)
    windows = [data[i:i + K] for i in range(0, len(data), K)]
    for win in windows:
        cnt = torch.tensor(float(sum((lab != -100).sum().item() for _, lab in win)))
        dist.all_reduce(cnt)
        for j, (ids, lab) in enumerate(win):
            model.set_requires_gradient_sync(j == len(win) - 1)
            logits = model(ids)
            loss = F.cross_entropy(logits.reshape(-1, V), lab.reshape(-1), ignore_index=-100, reduction="sum")
            (loss * WORLD / cnt).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()

    full = [p.full_tensor().detach().float().reshape(-1) for _, p in model.named_parameters()]
    if rank == 0:
        flat = torch.cat(full)
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
