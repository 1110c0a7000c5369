"""Masked-token denoising on FSDP2 with bf16 compute and fp32 gradient reduction,
ranks spawned by the script itself.

Micro-batches carry different numbers of masked (scored) tokens, so the window is
read ahead: its masked-token count is summed over the window and all-reduced over
the ranks, and each micro-batch's summed loss is divided by that count and multiplied
by W (FSDP2 averages gradients over the ranks). Gradient sync is off for the first
micro-batches of a window. The position table is frozen. The loop clears the
optimizer at the top of every micro-batch (a habit from the eager code path); the
window's partial gradient lives in FSDP2's unsharded accumulators meanwhile.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

PORT = 49151
WORLD = 2
VOCAB, DIM, SEQ, MASK_ID = 80, 48, 20, 0
K, MICRO, STEPS = 4, 6, 8


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.pos.weight.requires_grad_(False)
        self.layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 2 * DIM),
                                                   nn.GELU(), nn.Linear(2 * DIM, DIM))
                                     for _ in range(2)])
        self.lm = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        ctx = h.cumsum(1) / torch.arange(1, ids.shape[1] + 1, dtype=h.dtype)[:, None]
        h = h + ctx
        for layer in self.layers:
            h = h + layer(h)
        return self.lm(h)


def make_micro_batches(rank):
    g = torch.Generator().manual_seed(7 + rank)
    out = []
    for m in range(K * STEPS):
        clean = torch.randint(1, VOCAB, (MICRO, SEQ), generator=g)
        clean[:, 1::2] = (clean[:, 0::2] + 5) % (VOCAB - 1) + 1
        rate = 0.05 + 0.5 * torch.rand((), generator=g).item()      # uneven masking
        mask = torch.rand(MICRO, SEQ, generator=g) < rate
        mask[:, 0] = True
        noisy = clean.masked_fill(mask, MASK_ID)
        out.append((noisy, clean, mask))
    return out


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(11)
    model = Denoiser()
    mesh = init_device_mesh("cpu", (WORLD,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=3e-3, weight_decay=0.0)

    data = make_micro_batches(rank)
    for step in range(STEPS):
        window = data[step * K:(step + 1) * K]
        n_tok = torch.tensor(float(sum(int(m.sum()) for _, _, m in window)))
        dist.all_reduce(n_tok)
        for j, (noisy, clean, mask) in enumerate(window):
            opt.zero_grad(set_to_none=True)
            model.set_requires_gradient_sync(j == K - 1)
            logits = model(noisy).float()
            loss_sum = F.cross_entropy(logits[mask], clean[mask], reduction="sum")
            (loss_sum * WORLD / n_tok).backward()
        opt.step()

    h = hashlib.sha256()
    full = {}
    for name, p in model.named_parameters():
        t = p.full_tensor().detach().float().contiguous()
        full[name] = t
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
