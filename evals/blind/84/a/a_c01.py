"""Lightning Fabric, 2 DDP ranks: two optimizers, uneven micro-batches, a short
last window, and a stop/resume through fabric.save / fabric.load into fresh objects.

Loss normalisation: every window is one large batch, the loss is the sum over its
samples divided by the number of samples in the window on all ranks (x world size
because DDP averages the ranks' gradients).
"""
import hashlib, os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import lightning_fabric as L  # noqa: F401
from lightning_fabric import Fabric

K = 4
MICRO_PER_RANK = 14          # windows of 4, 4, 4, 2
VOCAB, DIM, CLASSES, SEQ = 50, 24, 4, 6
CKPT = "/tmp/blind84_a_c01_ckpt.pt"
STOP_AFTER = 2               # windows in the first session


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.body = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh(), nn.Linear(DIM, CLASSES))

    def forward(self, tok):
        return self.body(self.emb(tok).mean(1))


def micro_batches(rank):
    g = torch.Generator().manual_seed(500 + rank)
    out = []
    for i in range(MICRO_PER_RANK):
        n = 3 + (i + rank) % 3
        tok = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        y = (tok[:, 0] + tok[:, -1]) % CLASSES
        out.append((tok, y))
    return out


def build(fabric):
    torch.manual_seed(0)
    model = Net()
    opt_emb = torch.optim.SGD(model.emb.parameters(), lr=0.5, momentum=0.9)
    opt_body = torch.optim.AdamW(model.body.parameters(), lr=3e-3)
    model, opt_emb, opt_body = fabric.setup(model, opt_emb, opt_body)
    return model, opt_emb, opt_body


def run_windows(fabric, model, opts, data, start_w, stop_w):
    world = fabric.world_size
    for w in range(start_w, stop_w):
        window = data[w * K:(w + 1) * K]
        n_local = torch.tensor(float(sum(len(y) for _, y in window)))
        n_all = fabric.all_reduce(n_local, reduce_op="sum")
        for j, (tok, y) in enumerate(window):
            last = j == len(window) - 1
            with fabric.no_backward_sync(model, enabled=not last):
                loss = F.cross_entropy(model(tok), y, reduction="sum") * world / n_all
                fabric.backward(loss)
        for o in opts:
            fabric.clip_gradients(model, o, max_norm=0.8)
            o.step()
            o.zero_grad()


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if os.environ.get("PARAM_DUMP"):
        torch.save([p.detach().float().cpu() for _, p in module.named_parameters()], os.environ["PARAM_DUMP"])
    return h.hexdigest()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(1)
    data = micro_batches(fabric.global_rank)
    n_windows = (len(data) + K - 1) // K

    model, oe, ob = build(fabric)
    run_windows(fabric, model, (oe, ob), data, 0, STOP_AFTER)
    fabric.save(CKPT, {"model": model, "opt_emb": oe, "opt_body": ob, "window": STOP_AFTER})
    del model, oe, ob

    model, oe, ob = build(fabric)   # fresh objects, as after a preemption
    state = {"model": model, "opt_emb": oe, "opt_body": ob}
    rest = fabric.load(CKPT, state)
    run_windows(fabric, model, (oe, ob), data, rest["window"], n_windows)

    if fabric.global_rank == 0:
        print("FINAL_SHA256", param_sha(model.module if hasattr(model, "module") else model))


if __name__ == "__main__":
    main()
