"""Masked-token LM under FSDP2 with bf16 parameters and fp32 gradient reduction.

Spawns its own two ranks. Each window's loss is the token sum over the number of valid
tokens in the whole window (all micro-batches, all ranks), times the world size because
FSDP2 averages the reduce-scattered gradients. Micro-batches carry different numbers of
valid tokens, the last window of the run is short, gradient sync is off inside a window,
the unsharded parameters are kept between forward and backward, and the sharded gradients
are clipped (the clip acts) before the step.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

VOCAB, D, T, MB, K, N_MICRO, PORT = 40, 32, 12, 3, 4, 22, 38808   # windows 4,4,4,4,4,2
IGNORE = -100


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(),
                                                   nn.Linear(2 * D, D)) for _ in range(2)])
        self.head = nn.Linear(D, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


def micro_batches(rank):
    g = torch.Generator().manual_seed(500 + rank)
    out = []
    for _ in range(N_MICRO):
        x = torch.randint(0, VOCAB, (MB, T), generator=g)
        y = torch.roll(x, -1, dims=1)
        keep = torch.rand(MB, T, generator=g) < (0.2 + 0.7 * torch.rand(1, generator=g))
        out.append((x, y.masked_fill(~keep, IGNORE)))
    return out


def worker(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = LM()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp_policy, reshard_after_forward=False)
    fully_shard(model, mp_policy=mp_policy, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

    data = micro_batches(rank)
    for w0 in range(0, N_MICRO, K):
        window = data[w0:w0 + K]
        n_tok = torch.tensor(float(sum(int((y != IGNORE).sum()) for _, y in window)))
        dist.all_reduce(n_tok)
        for j, (x, y) in enumerate(window):
            last = j == len(window) - 1
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
            logits = model(x).float()
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                   ignore_index=IGNORE, reduction="sum")
            (loss * world / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.3)
        opt.step()
        opt.zero_grad(set_to_none=True)

    flat = torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().reshape(-1)
                      for _, p in model.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
