"""Token tagging with an encoder and a separate tagging head, two optimizers, Accelerate.
Token-level loss normalised over the whole window on all ranks; micro-batches have
different numbers of valid tokens.

Launch: torchrun --nproc-per-node 2 a_c02.py
"""
import hashlib
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed

VOCAB, TAGS, DIM, MAXLEN = 64, 9, 32, 14
K, MICRO, UPDATES = 3, 4, 8


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.emb.weight.requires_grad_(False)  # pretrained table kept frozen
        self.conv = nn.Conv1d(DIM, DIM, 3, padding=1)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        return h + self.mlp(h)


class TagHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.proj = nn.Linear(DIM, TAGS)

    def forward(self, h):
        return self.proj(self.norm(h))


def rank_batches(rank, n):
    """Pre-sharded data: each rank reads its own micro-batches (variable lengths, padded)."""
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(n):
        lens = torch.randint(2, MAXLEN + 1, (MICRO,), generator=g)
        ids = torch.zeros(MICRO, MAXLEN, dtype=torch.long)
        tags = torch.full((MICRO, MAXLEN), -100)
        for i, L in enumerate(lens.tolist()):
            ids[i, :L] = torch.randint(1, VOCAB, (L,), generator=g)
            tags[i, :L] = ids[i, :L] % TAGS
        out.append((ids, tags))
    return out


def sha_of(named):
    h = hashlib.sha256()
    for _, p in named:
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    plugin = GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False)
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    set_seed(5)
    enc, head = Encoder(), TagHead()
    opt_enc = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    W = acc.num_processes
    # prepared schedulers advance W times per optimizer step
    sch_enc = torch.optim.lr_scheduler.LambdaLR(opt_enc, lambda s: min(1.0, (s + 1) / (2 * W)))
    sch_head = torch.optim.lr_scheduler.LinearLR(opt_head, 1.0, 0.2, total_iters=UPDATES * W)
    enc, head, opt_enc, opt_head, sch_enc, sch_head = acc.prepare(enc, head, opt_enc, opt_head, sch_enc, sch_head)

    data = rank_batches(acc.process_index, UPDATES * K)
    params = [p for m in (enc, head) for p in m.parameters() if p.requires_grad]
    for w in range(UPDATES):
        window = data[w * K:(w + 1) * K]
        n_local = torch.tensor(float(sum(int((t != -100).sum()) for _, t in window)))
        # mean over ranks of the window's valid-token count = all-ranks count / W
        n_mean = acc.reduce(n_local, reduction="mean")
        for ids, tags in window:
            with acc.accumulate(enc, head):
                logits = head(enc(ids))
                tok_sum = F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1),
                                          ignore_index=-100, reduction="sum")
                # backward divides by K and DDP averages over W: K * sum / (N / W) -> sum / N
                acc.backward(tok_sum * K / n_mean)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(params, 1.0)
                for opt, sch in ((opt_enc, sch_enc), (opt_head, sch_head)):
                    opt.step()
                    sch.step()
                    opt.zero_grad()
        if acc.is_main_process:
            print(f"update {w + 1} tokens/rank {float(n_mean):.1f}", file=sys.stderr)

    named = [("enc." + n, p) for n, p in acc.unwrap_model(enc).named_parameters()]
    named += [("head." + n, p) for n, p in acc.unwrap_model(head).named_parameters()]
    if acc.is_main_process:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {sha_of(named)}")
    acc.end_training()


if __name__ == "__main__":
    main()
