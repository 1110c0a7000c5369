"""Intent classifier on DDP with static_graph=True and a custom fp32-averaging comm hook.

No no_sync(): every micro-batch all-reduces (averaged by the hook); the summed
gradients of a window are the window's mean because each micro-batch's summed loss is
scaled by W / (the window's all-ranks sample count).  Micro-batches differ in size per
rank.  Body on AdamW + cosine, head on SGD-momentum.  The run stops after 6 updates,
writes a checkpoint, and continues in freshly built objects.
"""
import hashlib
import io
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

IN, HID, CLS = 32, 64, 7
K, UPDATES, STOP = 2, 12, 6
SIZES = {0: (5, 3), 1: (4, 6)}  # micro-batch sizes per rank within a window


def fp32_avg_hook(group, bucket):
    buf = bucket.buffer()
    world = dist.get_world_size(group)
    work = dist.all_reduce(buf.to(torch.float32), group=group, async_op=True)

    def finish(fut):
        out = fut.value()[0].div_(world)
        buf.copy_(out)
        return buf

    return work.get_future().then(finish)


class IntentNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU())
        self.head = nn.Linear(HID, CLS)

    def forward(self, x):
        return self.head(self.body(x))


def window_data(rank, update):
    out = []
    for k, n in enumerate(SIZES[rank]):
        g = torch.Generator().manual_seed(77 + 1000 * update + 10 * k + rank)
        x = torch.randn(n, IN, generator=g)
        y = (x[:, :CLS] * torch.arange(1, CLS + 1)).argmax(1)
        out.append((x, y))
    return out


def build(state=None):
    torch.manual_seed(3)
    net = IntentNet()
    if state is not None:
        net.load_state_dict(state["model"])
    ddp = DDP(net, static_graph=True)
    ddp.register_comm_hook(dist.group.WORLD, fp32_avg_hook)
    opt_body = torch.optim.AdamW(net.body.parameters(), lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(net.head.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt_body, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, UPDATES) / UPDATES)))
    if state is not None:
        opt_body.load_state_dict(state["opt_body"])
        opt_head.load_state_dict(state["opt_head"])
        sched.load_state_dict(state["sched"])
    return ddp, opt_body, opt_head, sched


def train(ddp, opt_body, opt_head, sched, rank, world, start, stop):
    for update in range(start, stop):
        win = window_data(rank, update)
        n = torch.tensor(float(sum(len(y) for _, y in win)))
        dist.all_reduce(n)
        for x, y in win:
            loss = F.cross_entropy(ddp(x), y, reduction="sum") * world / n
            loss.backward()
        opt_body.step()
        opt_head.step()
        sched.step()
        opt_body.zero_grad(set_to_none=True)
        opt_head.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp, ob, oh, sch = build()
    train(ddp, ob, oh, sch, rank, world, 0, STOP)

    buf = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt_body": ob.state_dict(),
                "opt_head": oh.state_dict(), "sched": sch.state_dict()}, buf)
    del ddp, ob, oh, sch
    buf.seek(0)
    ddp, ob, oh, sch = build(torch.load(buf, weights_only=False))
    train(ddp, ob, oh, sch, rank, world, STOP, UPDATES)

    h = hashlib.sha256()
    for _, p in ddp.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
