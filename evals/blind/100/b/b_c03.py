"""DDP without no_sync(): the accumulating micro-batches run through the bare
module (`ddp.module`), so DDP's reducer never arms; the window's last
micro-batch runs through the DDP wrapper, whose backward all-reduces the whole
accumulated `.grad`.  Epochs of 8 micro-batches with K = 3 give 3-3-2 windows;
each window is averaged over its own number of micro-batches.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

D_IN, HID, MB, K, MICRO_PER_EPOCH, EPOCHS, LR, SEED = 16, 48, 4, 3, 8, 2, 4e-3, 5


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(D_IN + 1, HID), nn.SiLU(), nn.Linear(HID, HID), nn.SiLU())
        self.dec = nn.Linear(HID, D_IN)

    def forward(self, x_noisy, t):
        return self.dec(self.enc(torch.cat([x_noisy, t[:, None]], dim=-1)))


def build_model():
    torch.manual_seed(SEED)
    return Denoiser()


def epoch_batches(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        x0 = torch.randn(MB, D_IN, generator=g).cumsum(-1) / 4
        t = torch.rand(MB, generator=g)
        noise = torch.randn(MB, D_IN, generator=g)
        out.append((x0 * (1 - t[:, None]) + noise * t[:, None], t, noise))
    return out


def loss_fn(model, xn, t, noise):
    return F.mse_loss(model(xn, t), noise)


def windows(batches, k):
    for s in range(0, len(batches), k):
        yield batches[s:s + k]


def report(named_params):
    h = hashlib.sha256()
    for _, p in named_params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    ddp = DDP(build_model())
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR, weight_decay=0.01)

    for epoch in range(EPOCHS):
        for win in windows(epoch_batches(rank, epoch), K):
            n = len(win)
            for j, (xn, t, noise) in enumerate(win):
                net = ddp if j == n - 1 else ddp.module
                (loss_fn(net, xn, t, noise) / n).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        report(ddp.module.named_parameters())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
