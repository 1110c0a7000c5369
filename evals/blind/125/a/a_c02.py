"""FSDP2 trainer with a mid-run checkpoint, a teardown and a resume.

Each epoch has 8 micro-batches per rank cut into windows of 3, 3 and 2; every
window is averaged over its own length. After epoch 2 the trainer saves a DCP
checkpoint (model, optimizer, scheduler), throws everything away, rebuilds a
fresh model from another seed, loads the checkpoint and finishes the run.
"""
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


@dataclass
class Cfg:
    vocab: int = 72
    dim: int = 40
    seq: int = 10
    classes: int = 6
    rows: int = 4
    micro_per_epoch: int = 8
    accum: int = 3
    epochs: int = 3
    stop_after_epoch: int = 2
    lr: float = 3e-3
    clip: float = 0.8
    seed: int = 90210


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 3 * d)
        self.fc2 = nn.Linear(3 * d, d)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(self.ln(h))))


class Net(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList([Block(c.dim) for _ in range(2)])
        self.head = nn.Linear(c.dim, c.classes)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h.mean(1))


def build(c, seed):
    torch.manual_seed(seed)
    model = Net(c)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    return model, opt, sched


def epoch_data(c, epoch, rank, world):
    g = torch.Generator().manual_seed(c.seed + 1000 * epoch)
    ids = torch.randint(0, c.vocab, (world, c.micro_per_epoch, c.rows, c.seq), generator=g)
    y = (ids[..., 0] * 3 + ids[..., -1]) % c.classes
    return ids[rank], y[rank]


def windows(n, k):
    return [list(range(s, min(s + k, n))) for s in range(0, n, k)]


class Trainer:
    def __init__(self, c):
        self.c = c
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.model, self.opt, self.sched = build(c, c.seed)
        self.epoch = 0

    def run_epoch(self):
        ids, y = epoch_data(self.c, self.epoch, self.rank, self.world)
        for win in windows(self.c.micro_per_epoch, self.c.accum):
            for j, i in enumerate(win):
                self.model.set_requires_gradient_sync(j == len(win) - 1)
                loss = F.cross_entropy(self.model(ids[i]), y[i]) / len(win)
                loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.c.clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
        gn = gn.full_tensor() if isinstance(gn, DTensor) else gn
        if self.rank == 0:
            print(f"epoch {self.epoch} last grad_norm {gn.item():.4f} lr {self.sched.get_last_lr()[0]:.5f}")
        self.epoch += 1

    def save(self, path):
        msd, osd = get_state_dict(self.model, self.opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        return {"epoch": self.epoch, "sched": self.sched.state_dict()}

    def restore(self, path, meta):
        self.model, self.opt, self.sched = build(self.c, self.c.seed + 12345)
        msd, osd = get_state_dict(self.model, self.opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.sched.load_state_dict(meta["sched"])
        self.epoch = meta["epoch"]

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    c = Cfg()
    box = [tempfile.mkdtemp(prefix="a_c02_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt = os.path.join(box[0], "ckpt")
    t = Trainer(c)
    while t.epoch < c.stop_after_epoch:
        t.run_epoch()
    meta = t.save(ckpt)
    del t.model, t.opt, t.sched
    t.restore(ckpt, meta)
    while t.epoch < c.epochs:
        t.run_epoch()
    d = t.digest()
    dist.barrier()
    if dist.get_rank() == 0:
        print("FINAL_SHA256", d)
        shutil.rmtree(box[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
