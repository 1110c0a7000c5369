"""FSDP2 trainer: masked LM-style loss with uneven token counts, 4-4-3 windows per epoch,
two optimizers (AdamW trunk, SGD head), a clip that acts, normalised over each window's
all-ranks count of real tokens."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

CFG = dict(seed=5, vocab=80, dim=32, seq=10, micro_bs=4, accum=4, micro_per_epoch=11,
           epochs=2, clip=0.25)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Sequential(nn.Linear(d, 3 * d), nn.GELU(), nn.Linear(3 * d, d))

    def forward(self, x):
        return x + self.fc(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["dim"])
        self.blocks = nn.ModuleList(Block(c["dim"]) for _ in range(2))
        self.head = nn.Linear(c["dim"], c["vocab"])

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class Trainer:
    def __init__(self, c):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(c["seed"])
        m = TinyLM(c)
        mesh = init_device_mesh("cpu", (self.world,))
        for b in m.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(m, mesh=mesh)
        self.model = m
        head = list(m.head.parameters())
        trunk = [p for n, p in m.named_parameters() if not n.startswith("head.")]
        self.opts = [torch.optim.AdamW(trunk, lr=3e-3, weight_decay=0.01),
                     torch.optim.SGD(head, lr=0.1, momentum=0.9)]

    def epoch_data(self, epoch):
        c = self.c
        g = torch.Generator().manual_seed(c["seed"] * 100 + epoch)
        n = c["micro_per_epoch"] * self.world * c["micro_bs"]
        ids = torch.randint(0, c["vocab"], (n, c["seq"] + 1), generator=g)
        lengths = torch.randint(2, c["seq"] + 1, (n,), generator=g)
        mask = torch.arange(c["seq"])[None, :] < lengths[:, None]
        x, y = ids[:, :-1], ids[:, 1:].masked_fill(~mask, -100)
        x, y = x[self.rank::self.world], y[self.rank::self.world]
        mbs = [(x[i:i + c["micro_bs"]], y[i:i + c["micro_bs"]]) for i in range(0, x.shape[0], c["micro_bs"])]
        return [mbs[i:i + c["accum"]] for i in range(0, len(mbs), c["accum"])]

    def window_tokens(self, window):
        n = torch.tensor(float(sum(int((y != -100).sum()) for _, y in window)))
        dist.all_reduce(n, op=dist.ReduceOp.SUM)
        return n

    def run_window(self, window):
        n_tok = self.window_tokens(window)
        for j, (x, y) in enumerate(window):
            self.model.set_requires_gradient_sync(j == len(window) - 1)
            logits = self.model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   ignore_index=-100, reduction="sum")
            (loss * self.world / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c["clip"])
        for o in self.opts:
            o.step()
            o.zero_grad(set_to_none=True)

    def fit(self):
        for ep in range(self.c["epochs"]):
            for window in self.epoch_data(ep):
                self.run_window(window)

    def sha(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.full_tensor().detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    t = Trainer(CFG)
    t.fit()
    s = t.sha()
    if t.rank == 0:
        print(f"FINAL_SHA256 {s}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
