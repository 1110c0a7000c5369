"""DDP intent classifier (stock all-reduce comm hook, bucket views) with a frozen pretrained embedding,
a learnable logit temperature on its own optimizer, and a simulated
pre-emption: training stops after optimizer step 4, everything is saved, and
the job resumes into freshly built DDP / optimizer / scheduler objects.

Each epoch has 8 micro-batches per rank at K = 3 -> windows of 3, 3 and 2;
each micro-batch mean is divided by the size of the window it belongs to.
"""
import argparse
import contextlib
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--stop-after", type=int, default=4)
    p.add_argument("--ckpt", default=os.path.join(HERE, "tmp_scratch", "b_c03_ckpt.pt"))
    p.add_argument("--seed", type=int, default=5)
    return p.parse_args()


class IntentNet(nn.Module):
    def __init__(self, vocab=50, d=24, n_cls=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.GRU(d, d, batch_first=True)
        self.proj = nn.Linear(d, n_cls)
        self.log_temp = nn.Parameter(torch.zeros(()))

    def forward(self, tok):
        _, h = self.enc(self.emb(tok))
        return self.proj(h[-1]) * self.log_temp.exp()


def dataset(seed):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, 50, (64, 9), generator=g)
    y = (tok[:, :3].sum(1) % 6)
    return TensorDataset(tok, y)


class Job:
    def __init__(self, args):
        self.args = args
        torch.manual_seed(args.seed)
        net = IntentNet()
        net.emb.weight.requires_grad_(False)
        self.model = DDP(net, gradient_as_bucket_view=True, bucket_cap_mb=1)
        self.model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
        body = [p for n, p in net.named_parameters() if p.requires_grad and n != "log_temp"]
        self.opt = torch.optim.AdamW(body, lr=5e-3, weight_decay=0.01)
        self.opt_t = torch.optim.SGD([net.log_temp], lr=0.02)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, 0.25 * (s + 1)))
        self.ds = dataset(args.seed)
        self.sampler = DistributedSampler(self.ds, shuffle=True, seed=args.seed)
        self.step = 0

    def loader(self, epoch):
        self.sampler.set_epoch(epoch)
        return DataLoader(self.ds, batch_size=self.args.micro_bs, sampler=self.sampler, num_workers=1)

    def state(self):
        return {"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                "opt_t": self.opt_t.state_dict(), "sched": self.sched.state_dict(), "step": self.step}

    def load(self, st):
        self.model.module.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.opt_t.load_state_dict(st["opt_t"])
        self.sched.load_state_dict(st["sched"])
        self.step = st["step"]

    def train(self, stop_after=None):
        K = self.args.accum
        rank = dist.get_rank()
        n_micro = len(self.sampler) // self.args.micro_bs
        windows_per_epoch = -(-n_micro // K)
        for epoch in range(self.step // windows_per_epoch, self.args.epochs):
            skip = (self.step % windows_per_epoch) * K
            for i, (tok, y) in enumerate(self.loader(epoch)):
                if i < skip:
                    continue
                w_start = (i // K) * K
                w_size = min(K, n_micro - w_start)
                last = (i - w_start) == w_size - 1
                ctx = contextlib.nullcontext() if last else self.model.no_sync()
                with ctx:
                    loss = F.cross_entropy(self.model(tok), y) / w_size
                    loss.backward()
                if last:
                    self.opt.step()
                    self.opt_t.step()
                    self.sched.step()
                    self.opt.zero_grad(set_to_none=True)
                    self.opt_t.zero_grad(set_to_none=True)
                    self.step += 1
                    if rank == 0:
                        print(f"epoch {epoch} step {self.step} window {w_size} loss {loss.item() * w_size:.4f}", flush=True)
                    if stop_after is not None and self.step == stop_after:
                        return


def main():
    args = parse()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()

    job = Job(args)
    job.train(stop_after=args.stop_after)
    if rank == 0:
        os.makedirs(os.path.dirname(args.ckpt), exist_ok=True)
        torch.save(job.state(), args.ckpt)
    dist.barrier()
    del job

    job = Job(args)
    job.load(torch.load(args.ckpt, weights_only=False))
    job.train()

    h = hashlib.sha256()
    for _, p in job.model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
