"""Speaker-ID frame classifier on a DeepSpeed ZeRO-0 engine, accumulation by hand.

The engine is configured with GA 1 (every engine.step() is an optimizer step); the
loop accumulates itself: the first micro-batches of a window run under
`engine.no_sync()`, the loss is divided by the number of micro-batches in *this*
window (the epoch ends in a short window of 2), and engine.step() is called once per
window. Client SGD (Nesterov) + a client LambdaLR handed to the engine, which steps
it on every engine.step(); the engine clips at 0.5.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

K = 3
MICRO_BATCHES_PER_RANK = 20          # windows of 3,3,3,3,3,3,2
MICRO_BATCH = 6
FEAT, HID, N_SPK = 20, 48, 10

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO_BATCH,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.5,
    "steps_per_print": 10_000,
    "zero_optimization": {"stage": 0},
}


class FrameNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(FEAT, HID, kernel_size=5, padding=2)
        self.proj = nn.Linear(HID, HID)
        self.out = nn.Linear(HID, N_SPK)

    def forward(self, feats):                       # (B, T, FEAT)
        h = F.gelu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        h = F.gelu(self.proj(h)).mean(1)
        return self.out(h)


def windows(seq, k):
    for s in range(0, len(seq), k):
        yield seq[s:s + k]


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    g = torch.Generator().manual_seed(99)
    n = MICRO_BATCHES_PER_RANK * MICRO_BATCH * world
    centers = torch.randn(N_SPK, FEAT, generator=g)
    spk = torch.randint(0, N_SPK, (n,), generator=g)
    feats = centers[spk][:, None, :] + 1.5 * torch.randn(n, 30, FEAT, generator=g)
    micro = list(zip(feats[rank::world].split(MICRO_BATCH), spk[rank::world].split(MICRO_BATCH)))

    torch.manual_seed(5)
    model = FrameNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    n_updates = -(-MICRO_BATCHES_PER_RANK // K)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2) * (1 - s / (n_updates + 1)))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=DS_CONFIG)

    engine.train()
    for win in windows(micro, K):
        for j, (x, y) in enumerate(win):
            last = j == len(win) - 1
            loss = F.cross_entropy(engine(x), y) / len(win)
            if last:
                engine.backward(loss)
            else:
                with engine.no_sync():
                    engine.backward(loss)
        engine.step()
    assert engine.global_steps == n_updates

    full = {k: p.detach().float().cpu().contiguous()
            for k, p in engine.module.named_parameters()}
    h = hashlib.sha256()
    for t in full.values():
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])


if __name__ == "__main__":
    main()
