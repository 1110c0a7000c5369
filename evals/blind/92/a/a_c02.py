"""Accelerate: encoder + classifier head as two prepared models, two optimizers, frozen stem."""
import hashlib
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, TensorDataset

CFG = SimpleNamespace(seed=5, accum=3, micro_bs=4, n=96, epochs=2, lr_enc=1e-3, lr_head=5e-3, clip=0.5)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(12, 32)          # frozen (pretrained stand-in)
        self.body = nn.Sequential(nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32))

    def forward(self, x):
        return self.body(self.stem(x))


def main():
    set_seed(CFG.seed)
    torch.use_deterministic_algorithms(True)
    plugin = GradientAccumulationPlugin(num_steps=CFG.accum, sync_with_dataloader=True)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    enc, head = Encoder(), nn.Linear(32, 5)
    enc.stem.requires_grad_(False)
    opt_enc = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=CFG.lr_enc)
    opt_head = torch.optim.SGD(head.parameters(), lr=CFG.lr_head, momentum=0.9)
    g = torch.Generator().manual_seed(CFG.seed)
    x = torch.randn(CFG.n, 12, generator=g)
    y = (x[:, :5].argmax(1) + (x[:, 6] > 1).long()) % 5
    loader = DataLoader(TensorDataset(x, y), batch_size=CFG.micro_bs, shuffle=True)
    # 96 / 2 ranks / 4 = 12 micro-batches per epoch per rank = 4 windows of 3
    steps_per_epoch = len(loader) // (CFG.accum * 2)
    sched = torch.optim.lr_scheduler.LinearLR(opt_enc, 1.0, 0.1, total_iters=steps_per_epoch * CFG.epochs * acc.num_processes)
    enc, head, opt_enc, opt_head, loader, sched = acc.prepare(enc, head, opt_enc, opt_head, loader, sched)

    for epoch in range(CFG.epochs):
        for xb, yb in loader:
            with acc.accumulate(enc, head):
                loss = F.cross_entropy(head(enc(xb)), yb)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(list(enc.parameters()) + list(head.parameters()), CFG.clip)
                for o in (opt_enc, opt_head):
                    o.step()
                sched.step()
                for o in (opt_enc, opt_head):
                    o.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (acc.unwrap_model(enc), acc.unwrap_model(head)):
            for _, p in m.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
