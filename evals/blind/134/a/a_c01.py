"""DDP trainer: non-sync micro-steps run through ddp.module, the window's last through the DDP wrapper.
Two optimizers, an acting clip, 3-3-2 windows per epoch (each window averaged over its own length),
checkpoint after every epoch and a resume into brand-new objects."""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CFG = dict(seed=3, in_dim=20, hidden=40, out=3, micro=5, K=3, micro_per_epoch=8, epochs=3,
           body_lr=2e-3, head_lr=0.05, clip=0.5)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(CFG["in_dim"], CFG["hidden"]), nn.Tanh(),
                                  nn.Linear(CFG["hidden"], CFG["hidden"]), nn.Tanh())
        self.head = nn.Linear(CFG["hidden"], CFG["out"])

    def forward(self, x):
        return self.head(self.body(x))


class Trainer:
    def __init__(self, ckpt_path=None):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(CFG["seed"])
        net = Net()
        self.ddp = DDP(net)
        self.opt_body = torch.optim.AdamW(net.body.parameters(), lr=CFG["body_lr"])
        self.opt_head = torch.optim.SGD(net.head.parameters(), lr=CFG["head_lr"], momentum=0.8)
        self.epoch = 0
        if ckpt_path is not None:
            state = torch.load(ckpt_path, weights_only=False)
            net.load_state_dict(state["model"])
            self.opt_body.load_state_dict(state["opt_body"])
            self.opt_head.load_state_dict(state["opt_head"])
            self.epoch = state["epoch"]
        g = torch.Generator().manual_seed(CFG["seed"])
        n = self.world * CFG["micro"] * CFG["micro_per_epoch"]
        x = torch.randn(n, CFG["in_dim"], generator=g)
        y = torch.sin(x[:, :3] * 2.0) * 4.0 + x[:, 3:6]
        ds = TensorDataset(x, y)
        self.sampler = DistributedSampler(ds, shuffle=True, seed=CFG["seed"])
        self.loader = DataLoader(ds, batch_size=CFG["micro"], sampler=self.sampler)

    def save(self, path):
        if self.rank == 0:
            torch.save({"model": self.ddp.module.state_dict(), "opt_body": self.opt_body.state_dict(),
                        "opt_head": self.opt_head.state_dict(), "epoch": self.epoch}, path)
        dist.barrier()

    def run_epoch(self):
        K = CFG["K"]
        self.sampler.set_epoch(self.epoch)
        batches = list(self.loader)
        n = len(batches)
        for start in range(0, n, K):
            window = batches[start:start + K]
            for j, (x, y) in enumerate(window):
                last = j == len(window) - 1
                fwd = self.ddp if last else self.ddp.module  # only the last forward arms DDP's reducer
                loss = F.mse_loss(fwd(x), y) / len(window)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.ddp.parameters(), CFG["clip"])
            self.opt_body.step()
            self.opt_head.step()
            self.opt_body.zero_grad(set_to_none=True)
            self.opt_head.zero_grad(set_to_none=True)
        self.epoch += 1


def digest(model):
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(gathered[0], t) for t in gathered), "ranks diverged"
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    tmpdir = tempfile.mkdtemp(prefix="a_c01_") if dist.get_rank() == 0 else None
    box = [tmpdir]
    dist.broadcast_object_list(box, src=0)
    ckpt = os.path.join(box[0], "ckpt.pt")
    trainer = Trainer()
    trainer.run_epoch()
    trainer.save(ckpt)
    del trainer
    trainer = Trainer(ckpt_path=ckpt)  # resume into new objects
    while trainer.epoch < CFG["epochs"]:
        trainer.run_epoch()
    d = digest(trainer.ddp.module)
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {d}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
