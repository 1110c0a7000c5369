"""Accelerate: a token tagger split into an encoder and a classifier head, each with its own
optimizer and warm-up schedule; the pretrained embedding table stays frozen; a DataLoader
worker; gradient clipping over both modules on sync steps."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed


@dataclass
class Cfg:
    vocab: int = 50
    dim: int = 32
    tags: int = 7
    seq: int = 12
    rows: int = 288          # 2 ranks x 24 micro-batches of 6 rows -> 8 windows of 3 per rank
    micro: int = 6
    accum: int = 3
    warmup: int = 3          # optimizer steps
    clip: float = 0.5
    seed: int = 21


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.emb.weight.requires_grad_(False)          # frozen pretrained table
        self.mix = nn.Sequential(nn.Linear(c.dim, 2 * c.dim), nn.GELU(), nn.Linear(2 * c.dim, c.dim))
        self.norm = nn.LayerNorm(c.dim)

    def forward(self, x):
        h = self.emb(x)
        return self.norm(h + self.mix(h))


class Tags(Dataset):
    def __init__(self, c):
        g = torch.Generator().manual_seed(c.seed)
        self.x = torch.randint(0, c.vocab, (c.rows, c.seq), generator=g)
        self.y = (self.x * 3 + torch.roll(self.x, 1, dims=1)) % c.tags

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    c = Cfg()
    set_seed(c.seed)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=c.accum))
    assert acc.num_processes == 2

    enc, head = Encoder(c), nn.Linear(c.dim, c.tags)
    opt_enc = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.2, momentum=0.9)
    # prepared schedulers advance num_processes times per optimizer step
    ramp = lambda s: min(1.0, (s + 1) / (c.warmup * acc.num_processes))
    sch_enc = torch.optim.lr_scheduler.LambdaLR(opt_enc, ramp)
    sch_head = torch.optim.lr_scheduler.LambdaLR(opt_head, ramp)
    loader = DataLoader(Tags(c), batch_size=c.micro, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(c.seed))
    enc, head, opt_enc, opt_head, sch_enc, sch_head, loader = acc.prepare(
        enc, head, opt_enc, opt_head, sch_enc, sch_head, loader)

    for x, y in loader:
        with acc.accumulate(enc, head):
            logits = head(enc(x))
            loss = F.cross_entropy(logits.reshape(-1, c.tags), y.reshape(-1))
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(list(enc.parameters()) + list(head.parameters()), c.clip)
            for opt, sch in ((opt_enc, sch_enc), (opt_head, sch_head)):
                opt.step()
                sch.step()
                opt.zero_grad()

    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (acc.unwrap_model(enc), acc.unwrap_model(head)):
            for _, p in m.named_parameters():
                h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
