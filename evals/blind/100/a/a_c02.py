"""Token-level LM with Lightning Fabric: an encoder and an output head set up apart, two optimizers,
accumulation under `no_backward_sync`, and a checkpoint/resume into fresh objects at a window boundary.

Micro-batches have different numbers of valid tokens (padding); each window's loss is the token sum
over the window's valid tokens on all ranks (x world size, since DDP averages).
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "tmp_scratch", "a_c02_ckpt.pt")
VOCAB, DIM, SEQ, MB, K = 50, 32, 16, 4, 3
STEPS, STOP_AT = 8, 4


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Conv1d(DIM, DIM, 3, padding=2)

    def forward(self, x):
        h = self.emb(x).transpose(1, 2)
        return torch.tanh(self.mix(h)[..., : x.size(1)]).transpose(1, 2)


def batch_for(step, micro, rank):
    g = torch.Generator().manual_seed(10_000 * step + 100 * micro + rank)
    x = torch.randint(1, VOCAB, (MB, SEQ), generator=g)
    lens = torch.randint(3, SEQ + 1, (MB,), generator=g)
    y = torch.roll(x, -1, dims=1)
    pad = torch.arange(SEQ)[None, :] >= lens[:, None]
    y[pad] = -100
    return x, y


def build(fabric):
    torch.manual_seed(0)
    enc, head = Encoder(), nn.Linear(DIM, VOCAB)
    opt_e = torch.optim.AdamW(enc.parameters(), lr=2e-3, weight_decay=0.01)
    opt_h = torch.optim.SGD(head.parameters(), lr=5e-2, momentum=0.9)
    enc, opt_e = fabric.setup(enc, opt_e)
    head, opt_h = fabric.setup(head, opt_h)
    return enc, head, opt_e, opt_h


def train(fabric, enc, head, opt_e, opt_h, start, stop):
    for step in range(start, stop):
        window = [batch_for(step, m, fabric.global_rank) for m in range(K)]
        n_tok = torch.tensor(float(sum(int((y != -100).sum()) for _, y in window)))
        n_tok = fabric.all_reduce(n_tok, reduce_op="sum")
        for m, (x, y) in enumerate(window):
            last = m == K - 1
            with fabric.no_backward_sync(enc, enabled=not last), fabric.no_backward_sync(head, enabled=not last):
                logits = head(enc(x))
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100, reduction="sum")
                fabric.backward(loss * fabric.world_size / n_tok)
        fabric.clip_gradients(enc, opt_e, max_norm=0.5)
        opt_e.step()
        opt_h.step()
        opt_e.zero_grad(set_to_none=True)
        opt_h.zero_grad(set_to_none=True)


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    enc, head, opt_e, opt_h = build(fabric)
    train(fabric, enc, head, opt_e, opt_h, 0, STOP_AT)
    fabric.save(CKPT, {"enc": enc, "head": head, "opt_e": opt_e, "opt_h": opt_h, "step": STOP_AT})
    fabric.barrier()
    del enc, head, opt_e, opt_h

    # resume into freshly built objects
    enc, head, opt_e, opt_h = build(fabric)
    state = {"enc": enc, "head": head, "opt_e": opt_e, "opt_h": opt_h}
    rest = fabric.load(CKPT, state)
    train(fabric, enc, head, opt_e, opt_h, rest["step"], STEPS)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for mod in (enc, head):
            for _, p in mod.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
