"""FSDP2 LM fine-tune with a grown vocabulary (new tokens appended before sharding),
K = 4 accumulation where only the root unit defers its reduce-scatter (the block units
keep reducing every micro-batch, accumulating into their sharded fp32 gradients), and a
global-norm clip over the DTensor gradients that acts on every update.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Cfg:
    base_vocab: int = 48
    added_tokens: int = 8
    d: int = 32
    layers: int = 2
    T: int = 12
    micro_bs: int = 3
    K: int = 4
    updates: int = 10
    lr: float = 2e-3
    clip: float = 0.25
    seed: int = 555


class MLPBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 3 * d)
        self.fc2 = nn.Linear(3 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class ShiftLM(nn.Module):
    """Causal by construction: each position sees itself and the previous token."""

    def __init__(self, vocab, c: Cfg):
        super().__init__()
        self.embed = nn.Embedding(vocab, c.d)
        self.prev = nn.Linear(c.d, c.d, bias=False)
        self.blocks = nn.ModuleList(MLPBlock(c.d) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.d)
        self.out = nn.Linear(c.d, vocab)

    def forward(self, ids):
        e = self.embed(ids)
        x = e + self.prev(F.pad(e, (0, 0, 1, 0))[:, :-1])
        for b in self.blocks:
            x = b(x)
        return self.out(self.norm(x))


def grow_vocab(model: ShiftLM, n_new: int):
    old_e, old_o = model.embed, model.out
    V, d = old_e.weight.shape
    new_e = nn.Embedding(V + n_new, d)
    new_o = nn.Linear(d, V + n_new)
    with torch.no_grad():
        mean = old_e.weight.mean(0, keepdim=True)
        new_e.weight[:V] = old_e.weight
        new_e.weight[V:] = mean + 0.01 * torch.randn(n_new, d)
        new_o.weight[:V] = old_o.weight
        new_o.weight[V:] = old_o.weight.mean(0, keepdim=True)
        new_o.bias[:V] = old_o.bias
        new_o.bias[V:] = old_o.bias.min()
    model.embed, model.out = new_e, new_o
    return model


def batches(c: Cfg, rank, world):
    V = c.base_vocab + c.added_tokens
    g = torch.Generator().manual_seed(c.seed + 3)
    n = c.updates * c.K * c.micro_bs * world
    start = torch.randint(0, V, (n, 1), generator=g)
    seq = (start + 7 * torch.arange(c.T + 1)) % V
    seq = seq[rank::world]
    return seq.split(c.micro_bs)


def main():
    c = Cfg()
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(c.seed)
    model = grow_vocab(ShiftLM(c.base_vocab, c), c.added_tokens)
    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, betas=(0.9, 0.98), weight_decay=0.0)

    acted = 0
    data = batches(c, rank, world)
    for u in range(c.updates):
        window = data[u * c.K:(u + 1) * c.K]
        for j, seq in enumerate(window):
            # only the root's own parameters (embed, prev, norm, out) wait for the window end
            model.set_requires_gradient_sync(j == c.K - 1, recurse=False)
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
            (loss / c.K).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        acted += int(norm.item() > c.clip)
        opt.step()
        opt.zero_grad()

    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"updates {c.updates}, clip acted on {acted}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
