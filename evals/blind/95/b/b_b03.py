"""DDP classifier trainer with no_sync accumulation, preempted at step 6 and resumed into rebuilt objects."""
import argparse, hashlib, itertools, os, tempfile
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--bs", type=int, default=4)
    p.add_argument("--total_steps", type=int, default=12)
    p.add_argument("--preempt_at", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-2)
    return p.parse_args()


def build(args):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 5))
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    return model, opt, sched


def make_loader(args, world, rank):
    g = torch.Generator().manual_seed(3)
    n = args.total_steps * args.accum * args.bs * world
    x = torch.randn(n, 12, generator=g)
    y = (x[:, :5] * torch.randn(5, generator=g)).argmax(-1)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=False)
    return DataLoader(TensorDataset(x, y), batch_size=args.bs, sampler=sampler)


class Trainer:
    def __init__(self, args, ckpt_path):
        self.args, self.ckpt_path = args, ckpt_path
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.model, self.opt, self.sched = build(args)
        self.loader = make_loader(args, self.world, self.rank)
        self.step = 0

    def save(self):
        if self.rank == 0:
            torch.save({"model": self.model.module.state_dict(), "opt": self.opt.state_dict(),
                        "sched": self.sched.state_dict(), "step": self.step}, self.ckpt_path)
        dist.barrier()

    def load(self):
        ck = torch.load(self.ckpt_path, weights_only=False)
        self.model.module.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.sched.load_state_dict(ck["sched"])
        self.step = ck["step"]

    def micro_step(self, batch, sync):
        x, y = batch
        ctx = self.model.no_sync() if not sync else torch.enable_grad()
        with ctx:
            loss = F.cross_entropy(self.model(x), y) / self.args.accum
            loss.backward()

    def batches(self):
        # 1-based micro-batch counter; on resume skip the micro-batches already consumed
        if self.step == 0:
            return enumerate(self.loader, start=1)
        consumed = self.step * self.args.accum
        return enumerate(itertools.islice(iter(self.loader), consumed, None), start=consumed)

    def fit(self, stop_at):
        K = self.args.accum
        for micro, batch in self.batches():
            self.micro_step(batch, sync=(micro % K == 0))
            if micro % K == 0:
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
                self.step += 1
                if self.step == stop_at:
                    return


def main():
    args = get_args()
    dist.init_process_group("gloo")
    ckpt_dir = tempfile.mkdtemp(prefix="b_b03_") if dist.get_rank() == 0 else None
    obj = [ckpt_dir]
    dist.broadcast_object_list(obj, src=0)
    path = os.path.join(obj[0], "ckpt.pt")

    first = Trainer(args, path)
    first.fit(stop_at=args.preempt_at)
    first.save()
    del first

    second = Trainer(args, path)
    second.load()
    second.fit(stop_at=args.total_steps)

    params = [p.detach().float().reshape(-1) for _, p in second.model.module.named_parameters()]
    if dist.get_rank() == 0:
        flat = torch.cat(params)
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
