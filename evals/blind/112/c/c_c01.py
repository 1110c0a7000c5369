"""DDP trainer with fp16 autocast + GradScaler, clipping after unscale, a short last window
per epoch, and a preemption: the run is checkpointed at a window boundary and resumed into
fresh model / optimizer / scaler / scheduler objects."""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HP = dict(in_dim=20, hidden=48, classes=6, micro_bs=6, K=3, micro_per_epoch=7, epochs=3,
          lr=1e-2, clip=0.5, port=49207, preempt_after_steps=4)


def make_model():
    return nn.Sequential(nn.Linear(HP["in_dim"], HP["hidden"]), nn.ReLU(),
                         nn.Linear(HP["hidden"], HP["hidden"]), nn.ReLU(),
                         nn.Linear(HP["hidden"], HP["classes"]))


class AmpTrainer:
    def __init__(self, rank, world, ckpt):
        self.rank, self.world, self.ckpt = rank, world, ckpt
        torch.manual_seed(0)
        self.net = make_model()
        self.model = DDP(self.net)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=HP["lr"])
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=3, gamma=0.7)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
        self.epoch, self.steps_done = 0, 0

    def batch(self, epoch, i):
        g = torch.Generator().manual_seed(epoch * 1000 + i * 10 + self.rank)
        x = torch.randn(HP["micro_bs"], HP["in_dim"], generator=g)
        y = (x[:, :HP["classes"]] * 2 + x[:, HP["classes"]:2 * HP["classes"]]).argmax(1)
        return x, y

    def windows(self):
        K, n = HP["K"], HP["micro_per_epoch"]
        return [list(range(s, min(s + K, n))) for s in range(0, n, K)]

    def step_window(self, epoch, idxs):
        n = len(idxs)
        for j, i in enumerate(idxs):
            x, y = self.batch(epoch, i)
            self.model.require_backward_grad_sync = (j == n - 1)
            with torch.autocast("cpu", dtype=torch.float16):
                out = self.model(x)
            loss = F.cross_entropy(out.float(), y) / n
            self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), HP["clip"])
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps_done += 1

    def save(self, epoch, widx):
        if self.rank == 0:
            torch.save({"model": self.net.state_dict(), "opt": self.opt.state_dict(),
                        "sched": self.sched.state_dict(), "scaler": self.scaler.state_dict(),
                        "epoch": epoch, "widx": widx, "steps": self.steps_done}, self.ckpt)
        dist.barrier()

    def load(self):
        st = torch.load(self.ckpt, weights_only=False)
        self.net.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.scaler.load_state_dict(st["scaler"])
        self.steps_done = st["steps"]
        return st["epoch"], st["widx"]

    def fit(self, start=(0, 0), stop_after=None):
        e0, w0 = start
        for epoch in range(e0, HP["epochs"]):
            wins = self.windows()
            for widx in range(w0 if epoch == e0 else 0, len(wins)):
                self.step_window(epoch, wins[widx])
                if stop_after is not None and self.steps_done == stop_after:
                    nxt = (epoch, widx + 1) if widx + 1 < len(wins) else (epoch + 1, 0)
                    self.save(*nxt)
                    return False
        return True


def sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world, ckpt):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(HP["port"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    first = AmpTrainer(rank, world, ckpt)
    first.fit(stop_after=HP["preempt_after_steps"])
    del first
    resumed = AmpTrainer(rank, world, ckpt)
    start = resumed.load()
    resumed.fit(start=start)
    if rank == 0:
        print("FINAL_SHA256", sha(resumed.net), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, os.path.join(d, "ckpt.pt")), nprocs=2, join=True)
