"""Masked-token denoiser with FSDP2 on self-spawned ranks.

Every rank draws micro-batches of its own size (5 and 3 sequences) with a
variable number of masked positions. Each optimizer step normalises the
summed token loss by the whole window's masked-token count over all ranks;
FSDP2 divides the reduced gradient by the world size, so the loss is scaled
by W. An epoch has 10 micro-batches at K = 4: windows of 4, 4 and 2.
Body and head have their own optimizers; one global clip covers both.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy

PORT = 49110
WORLD = 2
VOCAB, D, T = 64, 40, 12
K = 4
MICRO_PER_EPOCH = 10
EPOCHS = 2
MASK_ID = VOCAB - 1
CLIP = 0.8
SEED = 31


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 3 * D), nn.GELU(), nn.Linear(3 * D, D))
        self.mix = nn.Linear(T, T, bias=False)

    def forward(self, h):
        h = h + self.mix(h.transpose(1, 2)).transpose(1, 2)
        return h + self.ff(self.norm(h))


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Layer() for _ in range(3)])
        self.head = nn.Linear(D, VOCAB)

    def forward(self, tok):
        h = self.embed(tok)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def make_micro(rank, epoch, i):
    bs = 5 if rank == 0 else 3
    g = torch.Generator().manual_seed(SEED * 7919 + rank * 1000 + epoch * 100 + i)
    start = torch.randint(0, VOCAB - 1, (bs, 1), generator=g)
    clean = (start + torch.arange(T)) % (VOCAB - 1)
    rate = 0.1 + 0.5 * torch.rand(bs, 1, generator=g)
    mask = torch.rand(bs, T, generator=g) < rate
    return clean.masked_fill(mask, MASK_ID), clean, mask


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    model = Denoiser()
    mesh = init_device_mesh("cpu", (WORLD,))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)

    head_params = [p for n, p in model.named_parameters() if n.startswith("head.")]
    body_params = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    opt_body = torch.optim.AdamW(body_params, lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(head_params, lr=0.05, momentum=0.9)

    step = 0
    for epoch in range(EPOCHS):
        micros = [make_micro(rank, epoch, i) for i in range(MICRO_PER_EPOCH)]
        for w0 in range(0, MICRO_PER_EPOCH, K):
            window = micros[w0:w0 + K]
            n_masked = torch.tensor(float(sum(int(m.sum()) for _, _, m in window)))
            dist.all_reduce(n_masked)
            for j, (noisy, clean, mask) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(noisy)
                tok_loss = F.cross_entropy(logits.reshape(-1, VOCAB), clean.reshape(-1), reduction="none")
                loss = (tok_loss * mask.reshape(-1)).sum() / n_masked * WORLD
                loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad(set_to_none=True)
            opt_head.zero_grad(set_to_none=True)
            step += 1
            if rank == 0:
                gn = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
                print(f"epoch {epoch} step {step} window {len(window)} grad_norm {float(gn):.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
