"""Bradley-Terry reward model on 2 spawned ranks without DDP.

* gradients averaged by hand once per window (flattened buckets)
* a frozen token embedding (pretrained in spirit), AdamW for the encoder, SGD+momentum for the head
* the run is "pre-empted" after step 5: everything is saved to disk at that optimizer-step
  boundary, the objects are thrown away, rebuilt from scratch and loaded, and training resumes.
"""
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

CFG = dict(vocab=50, dim=32, seq=10, pairs_per_micro=6, accum=3, total_steps=10, preempt_at=5,
           lr_enc=1e-3, lr_head=5e-2, seed=21, port=49251)


class RewardModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab"], c["dim"])
        self.emb.weight.requires_grad_(False)
        self.enc = nn.GRU(c["dim"], c["dim"], batch_first=True)
        self.head = nn.Linear(c["dim"], 1)

    def forward(self, ids):
        out, _ = self.enc(self.emb(ids))
        return self.head(out[:, -1]).squeeze(-1)


class Trainer:
    def __init__(self, rank, world, c):
        self.rank, self.world, self.c = rank, world, c
        torch.manual_seed(c["seed"])
        self.model = RewardModel(c)
        self.opt_enc = torch.optim.AdamW(self.model.enc.parameters(), lr=c["lr_enc"], weight_decay=0.01)
        self.opt_head = torch.optim.SGD(self.model.head.parameters(), lr=c["lr_head"], momentum=0.9)
        self.step = 0
        g = torch.Generator().manual_seed(c["seed"] + 1)
        n = c["total_steps"] * c["accum"] * world * c["pairs_per_micro"]
        self.chosen = torch.randint(0, c["vocab"], (n, c["seq"]), generator=g)
        self.rejected = torch.randint(0, c["vocab"], (n, c["seq"]), generator=g)
        self.chosen[:, -1] = self.chosen[:, 0] % 7  # some learnable signal

    def trainable(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def micro(self, k):
        c = self.c
        lo = ((self.step * c["accum"] + k) * self.world + self.rank) * c["pairs_per_micro"]
        return self.chosen[lo:lo + c["pairs_per_micro"]], self.rejected[lo:lo + c["pairs_per_micro"]]

    def average_grads(self):
        grads = [p.grad for p in self.trainable()]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.world)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)

    def train_step(self):
        K = self.c["accum"]
        for k in range(K):
            ch, rj = self.micro(k)
            margin = self.model(ch) - self.model(rj)
            loss = -F.logsigmoid(margin).mean() / K
            loss.backward()
        self.average_grads()
        self.opt_enc.step()
        self.opt_head.step()
        self.opt_enc.zero_grad(set_to_none=True)
        self.opt_head.zero_grad(set_to_none=True)
        self.step += 1
        return loss.item() * K

    def state(self):
        return dict(model=self.model.state_dict(), opt_enc=self.opt_enc.state_dict(),
                    opt_head=self.opt_head.state_dict(), step=self.step)

    def load(self, sd):
        self.model.load_state_dict(sd["model"])
        self.opt_enc.load_state_dict(sd["opt_enc"])
        self.opt_head.load_state_dict(sd["opt_head"])
        self.step = sd["step"]


def worker(rank, world, c, ckpt_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(c["port"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    tr = Trainer(rank, world, c)
    while tr.step < c["preempt_at"]:
        l = tr.train_step()
    path = os.path.join(ckpt_dir, "rm.pt")
    if rank == 0:
        torch.save(tr.state(), path)
        print(f"checkpoint at step {tr.step} loss {l:.4f}", flush=True)
    dist.barrier()
    del tr
    tr = Trainer(rank, world, c)  # fresh objects, as after a restart
    tr.load(torch.load(path, weights_only=False))
    while tr.step < c["total_steps"]:
        l = tr.train_step()
    if rank == 0:
        print(f"done at step {tr.step} loss {l:.4f}", flush=True)
        h = hashlib.sha256()
        for _, p in tr.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, CFG, d), nprocs=2, join=True)
