"""Fabric token-level LM training on ragged ranks, stopped and resumed.

* the two ranks read micro-batches of different sizes (3 and 5 rows) with padded,
  variable-length sequences, so token counts differ per micro-batch and per rank;
* each window's micro-batches are read ahead and the loss is the token sum over
  the window's all-ranks token count (x world size, since DDP averages);
* 8 micro-batches per epoch at K = 3: windows of 3, 3 and 2;
* body and head have their own optimizers (AdamW / SGD with momentum), one clip;
* after epoch 0 the run is checkpointed and resumed into fresh objects.
Launched with torchrun.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

VOCAB, D, PAD = 50, 40, 0
SEQ = 14
K = 3
MICRO_PER_EPOCH = 8
EPOCHS = 2
ROWS = {0: 3, 1: 5}
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c02_ckpt.pt")


class GRULM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D, padding_idx=PAD)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


def rank_batches(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        n = ROWS[rank]
        x = torch.randint(1, VOCAB, (n, SEQ + 1), generator=g)
        lengths = torch.randint(4, SEQ + 2, (n,), generator=g)
        pos = torch.arange(SEQ + 1)[None, :]
        x = x.masked_fill(pos >= lengths[:, None], PAD)
        out.append((x[:, :-1], x[:, 1:]))
    return out


def build(fabric):
    model = GRULM()
    body = [p for n, p in model.named_parameters() if not n.startswith("head.")]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.2, momentum=0.9)
    model, opt_body, opt_head = fabric.setup(model, opt_body, opt_head)
    return model, opt_body, opt_head


def run_epoch(fabric, model, opts, epoch):
    batches = rank_batches(fabric.global_rank, epoch)
    for start in range(0, len(batches), K):
        window = batches[start:start + K]
        n_local = sum(int((y != PAD).sum()) for _, y in window)
        n_global = fabric.all_reduce(torch.tensor(float(n_local)), reduce_op="sum")
        for i, (x, y) in enumerate(window):
            last = i == len(window) - 1
            with fabric.no_backward_sync(model, enabled=not last):
                logits = model(x)
                loss_sum = F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                           ignore_index=PAD, reduction="sum")
                fabric.backward(loss_sum * fabric.world_size / n_global)
        fabric.clip_gradients(model, opts[0], max_norm=0.3)
        for opt in opts:
            opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        if fabric.global_rank == 0:
            print(f"epoch {epoch} window@{start} tokens {int(n_global)}", flush=True)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(5)

    model, opt_body, opt_head = build(fabric)
    run_epoch(fabric, model, (opt_body, opt_head), epoch=0)
    os.makedirs(os.path.dirname(CKPT), exist_ok=True)
    fabric.save(CKPT, {"model": model, "opt_body": opt_body, "opt_head": opt_head, "epoch": 0})
    fabric.barrier()
    del model, opt_body, opt_head

    # resume into new objects (as a restarted job would)
    fabric.seed_everything(99)
    model, opt_body, opt_head = build(fabric)
    state = {"model": model, "opt_body": opt_body, "opt_head": opt_head, "epoch": -1}
    fabric.load(CKPT, state)
    for epoch in range(state["epoch"] + 1, EPOCHS):
        run_epoch(fabric, model, (opt_body, opt_head), epoch)

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(model.module)}", flush=True)


if __name__ == "__main__":
    main()
