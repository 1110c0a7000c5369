"""DDP trainer class interrupted after a few windows, checkpointed, and resumed into new objects."""
import argparse
import contextlib
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=26)   # windows 4 x 6 + 2
    p.add_argument("--stop-after", type=int, default=3)       # optimizer steps before the interruption
    p.add_argument("--seed", type=int, default=21)
    return p.parse_args()


def make_model():
    return nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 3))


class Trainer:
    def __init__(self, args, data):
        self.args = args
        torch.manual_seed(args.seed)
        self.model = DDP(make_model())
        head = self.model.module[-1]
        body = [p for m in list(self.model.module)[:-1] for p in m.parameters()]
        self.opt = torch.optim.AdamW([{"params": body, "lr": 3e-3},
                                      {"params": head.parameters(), "lr": 1e-2, "weight_decay": 0.0}])
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=3, gamma=0.5)
        self.data = data
        self.step = 0

    def windows(self):
        K = self.args.accum
        return [list(range(s, min(s + K, len(self.data)))) for s in range(0, len(self.data), K)]

    def train_window(self, idx):
        for j, i in enumerate(idx):
            x, y = self.data[i]
            ctx = self.model.no_sync() if j < len(idx) - 1 else contextlib.nullcontext()
            with ctx:
                loss = F.cross_entropy(self.model(x), y) / len(idx)   # short last window over its own length
                loss.backward()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1

    def fit(self, until=None):
        for idx in self.windows()[self.step:]:
            if until is not None and self.step >= until:
                return
            self.train_window(idx)

    def state_dict(self):
        return {"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(), "step": self.step}

    def load_state_dict(self, sd):
        self.model.module.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])
        self.sched.load_state_dict(sd["sched"])
        self.step = sd["step"]


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    args = get_args()
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(args.seed + rank)
    data = [(torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(args.micro_batches)]

    first = Trainer(args, data)
    first.fit(until=args.stop_after)
    ckdir = tempfile.mkdtemp(prefix="a_c03_") if rank == 0 else None
    box = [ckdir]
    dist.broadcast_object_list(box)
    path = os.path.join(box[0], "ckpt.pt")
    if rank == 0:
        torch.save(first.state_dict(), path)
    dist.barrier()
    del first

    second = Trainer(args, data)            # fresh model, optimizer and schedule
    second.load_state_dict(torch.load(path, weights_only=False))
    second.fit()
    dist.barrier()
    if rank == 0:
        os.remove(path)
        os.rmdir(box[0])
        h = hashlib.sha256()
        for _, p in second.model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
