"""FSDP2 on two spawned CPU ranks.  Accumulation is done through FSDP2 itself:
the micro-batch losses of a window are summed (no 1/K), gradient sync runs on
the window's last micro-batch only, and each window sets the reduce divide
factor to (micro-batches in this window) x world size.  The data ends in a
short last window; a frozen positional table, AdamW and a clip on the sharded
(DTensor) gradients round it off."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, fully_shard

PORT = 49151
WORLD = 2
K = 4
MICRO = 5
N_MICRO = 22          # per rank: 5 full windows of 4 + a short window of 2
SEQ, VOCAB, DIM = 10, 64, 32


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.tok_mix = nn.Linear(SEQ, SEQ)
        self.ff = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, h):
        h = h + self.tok_mix(self.ln(h).transpose(1, 2)).transpose(1, 2)
        return h + self.ff(self.ln(h))


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.1, requires_grad=False)
        self.layers = nn.ModuleList([Mixer(), Mixer()])
        self.out = nn.Linear(DIM, 8)

    def forward(self, tok):
        h = self.emb(tok) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def fsdp_units(model):
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Tagger()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    for unit in fsdp_units(model):
        unit.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3,
                            weight_decay=0.01)

    g = torch.Generator().manual_seed(5)
    tok = torch.randint(0, VOCAB, (WORLD * N_MICRO * MICRO, SEQ), generator=g)
    lab = (tok * 3 + tok.roll(1, 1)) % 8
    tok, lab = tok[rank::WORLD], lab[rank::WORLD]
    micro = list(zip(tok.split(MICRO), lab.split(MICRO)))
    windows = [micro[i:i + K] for i in range(0, len(micro), K)]

    for step, window in enumerate(windows):
        n = len(window)
        for unit in fsdp_units(model):
            unit.set_gradient_divide_factor(float(n * WORLD))
        for i, (x, y) in enumerate(window):
            model.set_requires_gradient_sync(i == n - 1)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.3)
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} micro {n} loss {loss.item():.4f} gnorm {gn.full_tensor().item():.3f}",
                  flush=True)

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(full.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
