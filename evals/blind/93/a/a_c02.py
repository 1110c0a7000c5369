"""Accelerate: a shared encoder and a task head as two prepared models with their own AdamW and
warm-up schedules, one accumulate(encoder, head) block per micro-batch, a frozen input projection,
a worker DataLoader, and a global-norm clip on the sync micro-step."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed


@dataclass
class RunConfig:
    d_in: int = 16
    d_model: int = 32
    n_out: int = 3
    micro_batch: int = 6
    accum_steps: int = 2
    epochs: int = 3
    n_rows: int = 240          # 120 rows per rank -> 20 micro-batches -> 10 updates per epoch
    enc_lr: float = 2e-3
    head_lr: float = 5e-3
    warmup: int = 4
    max_norm: float = 0.3
    seed: int = 17


class RowSet(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(99)
        self.x = torch.randn(cfg.n_rows, cfg.d_in, generator=g)
        self.y = torch.randn(cfg.n_rows, cfg.n_out, generator=g) + self.x[:, : cfg.n_out].sin()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.proj_in = nn.Linear(cfg.d_in, cfg.d_model)   # frozen (kept from a previous stage)
        self.block = nn.Sequential(nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, cfg.d_model), nn.GELU())
        for p in self.proj_in.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        h = self.proj_in(x)
        return h + self.block(h)


def warmup_then_flat(warmup):
    return lambda step: min(1.0, (step + 1) / warmup)


def main():
    cfg = RunConfig()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=cfg.accum_steps)
    set_seed(cfg.seed)
    encoder, head = Encoder(cfg), nn.Linear(cfg.d_model, cfg.n_out)
    enc_opt = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=cfg.enc_lr)
    head_opt = torch.optim.AdamW(head.parameters(), lr=cfg.head_lr, weight_decay=0.0)
    # prepared schedulers advance num_processes times per optimizer step
    enc_sched = torch.optim.lr_scheduler.LambdaLR(enc_opt, warmup_then_flat(cfg.warmup * acc.num_processes))
    head_sched = torch.optim.lr_scheduler.LambdaLR(head_opt, warmup_then_flat(cfg.warmup * acc.num_processes))
    loader = DataLoader(RowSet(cfg), batch_size=cfg.micro_batch, shuffle=False, num_workers=1)

    encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader = acc.prepare(
        encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader)

    for _ in range(cfg.epochs):
        for x, y in loader:
            with acc.accumulate(encoder, head):
                loss = F.smooth_l1_loss(head(encoder(x)), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    params = [p for m in (encoder, head) for p in m.parameters() if p.requires_grad]
                    acc.clip_grad_norm_(params, cfg.max_norm)
                for opt, sched in ((enc_opt, enc_sched), (head_opt, head_sched)):
                    opt.step()
                    sched.step()
                    opt.zero_grad()

    enc, hd = acc.unwrap_model(encoder), acc.unwrap_model(head)
    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (enc, hd):
            for _, p in m.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
