"""DDP classifier trainer split over methods: AdamW for the trunk and SGD with
momentum for the head, an epoch of 5 micro-batches at K = 2 (2-2-1 windows, the
short window averaged over its own micro-batches), one global-norm clip per
window, and a restart after the first epoch into freshly built objects from a
checkpoint written at that boundary.
"""
import hashlib
import io

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

SETTINGS = dict(dim=20, classes=6, micro=6, accum=2, batches=5, epochs=3, clip=0.3, seed=21)


class Classifier(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.trunk(x))


def shard(epoch, rank, s):
    g = torch.Generator().manual_seed(s["seed"] * 1000 + epoch * 10 + rank)
    proto = torch.randn(s["classes"], s["dim"], generator=torch.Generator().manual_seed(0))
    out = []
    for _ in range(s["batches"]):
        y = torch.randint(0, s["classes"], (s["micro"],), generator=g)
        x = proto[y] + 0.8 * torch.randn(s["micro"], s["dim"], generator=g)
        out.append((x, y))
    return out


class Run:
    def __init__(self, s, state=None):
        self.s = s
        self.rank = dist.get_rank()
        torch.manual_seed(s["seed"])
        self.net = Classifier(s["dim"], s["classes"])
        self.ddp = DDP(self.net)
        self.opts = [
            torch.optim.AdamW(self.net.trunk.parameters(), lr=2e-3, weight_decay=0.05),
            torch.optim.SGD(self.net.head.parameters(), lr=5e-2, momentum=0.9),
        ]
        self.epoch = 0
        if state is not None:
            self.net.load_state_dict(state["model"])
            for o, sd in zip(self.opts, state["opts"]):
                o.load_state_dict(sd)
            self.epoch = state["epoch"]

    def checkpoint(self):
        buf = io.BytesIO()
        torch.save({"model": self.net.state_dict(), "opts": [o.state_dict() for o in self.opts], "epoch": self.epoch}, buf)
        return buf.getvalue()

    def _backward(self, x, y, scale, sync):
        if sync:
            F.cross_entropy(self.ddp(x), y).mul(scale).backward()
        else:
            with self.ddp.no_sync():
                F.cross_entropy(self.ddp(x), y).mul(scale).backward()

    def _apply(self):
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.s["clip"])
        for o in self.opts:
            o.step()
        for o in self.opts:
            o.zero_grad(set_to_none=True)

    def one_epoch(self):
        data = shard(self.epoch, self.rank, self.s)
        K = self.s["accum"]
        for start in range(0, len(data), K):
            window = data[start:start + K]
            for j, (x, y) in enumerate(window):
                self._backward(x, y, 1.0 / len(window), sync=(j == len(window) - 1))
            self._apply()
        self.epoch += 1

    def until(self, epochs):
        while self.epoch < epochs:
            self.one_epoch()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    s = SETTINGS
    first = Run(s)
    first.until(1)
    blob = first.checkpoint()
    del first
    second = Run(s, state=torch.load(io.BytesIO(blob), weights_only=False))
    second.until(s["epochs"])
    h = hashlib.sha256()
    for _, p in second.net.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if dist.get_rank() == 0:
        print("FINAL_SHA256", h.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
