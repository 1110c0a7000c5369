"""Token tagging with Accelerate: a PEFT-LoRA encoder and a separately prepared tag head.

Two models, two optimizers (AdamW for the adapters, SGD + Nesterov momentum for the
head) and two prepared schedulers, all inside one ``accumulate(encoder, head)`` block.
Padding makes token counts uneven, so the loss is a token sum over the whole window's
token count on all ranks; it is multiplied by num_processes (DDP averages) and by K
(``accelerator.backward`` divides by K).  Each rank reads its own shard with a plain
DataLoader and groups it into windows of K micro-batches.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset

VOCAB, DIM, TAGS, SEQ = 80, 32, 6, 16
K = 2
MICRO = 4
EPOCHS = 2


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.proj1 = nn.Linear(DIM, DIM)
        self.proj2 = nn.Linear(DIM, DIM)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + F.gelu(self.proj1(h))
        return h + torch.tanh(self.proj2(h))


class TagHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, TAGS)

    def forward(self, h, labels=None, mode="logits"):
        logits = self.out(self.norm(h))
        if mode == "logits":
            return logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")


def make_shard(rank, world):
    g = torch.Generator().manual_seed(21)
    n = 64
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    lengths = torch.randint(4, SEQ + 1, (n,), generator=g)
    tags = (ids % TAGS)
    pos = torch.arange(SEQ).unsqueeze(0)
    tags = torch.where(pos < lengths.unsqueeze(1), tags, torch.full_like(tags, -100))
    ids = torch.where(pos < lengths.unsqueeze(1), ids, torch.zeros_like(ids))
    return TensorDataset(ids[rank::world], tags[rank::world])   # 32 sequences = 8 micro-batches per rank


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    torch.use_deterministic_algorithms(True)
    acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
    set_seed(5)
    enc = get_peft_model(Encoder(), LoraConfig(r=4, lora_alpha=8, target_modules=["proj1", "proj2"],
                                               lora_dropout=0.0))
    head = TagHead()
    opt_enc = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
    opt_head = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    shard = make_shard(acc.process_index, acc.num_processes)
    loader = DataLoader(shard, batch_size=MICRO, shuffle=True, generator=torch.Generator().manual_seed(acc.process_index))
    updates = EPOCHS * (len(loader) // K)
    # prepared schedulers advance num_processes times per optimizer step
    sch_enc = torch.optim.lr_scheduler.LinearLR(opt_enc, 1.0, 0.1, total_iters=updates * acc.num_processes)
    sch_head = torch.optim.lr_scheduler.CosineAnnealingLR(opt_head, T_max=updates * acc.num_processes)
    enc, head, opt_enc, opt_head, sch_enc, sch_head = acc.prepare(enc, head, opt_enc, opt_head, sch_enc, sch_head)

    for epoch in range(EPOCHS):
        for window in windows(loader, K):
            local = sum((t != -100).sum() for _, t in window).to(acc.device)
            n_tokens = acc.reduce(local, reduction="sum").float()
            for ids, tags in window:
                with acc.accumulate(enc, head):
                    h = enc(ids)
                    loss_sum = head(h, tags, mode="loss_sum")
                    acc.backward(loss_sum / n_tokens * acc.num_processes * K)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(list(enc.parameters()) + list(head.parameters()), 0.8)
                    opt_enc.step()
                    opt_head.step()
                    sch_enc.step()
                    sch_head.step()
                    opt_enc.zero_grad()
                    opt_head.zero_grad()
        acc.print(f"epoch {epoch} last loss {(loss_sum / (tags != -100).sum()).item():.4f}")

    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (acc.unwrap_model(enc), acc.unwrap_model(head)):
            for _, p in m.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    acc.end_training()


if __name__ == "__main__":
    main()
