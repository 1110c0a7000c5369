"""Lightning Fabric LM-style training on 2 DDP ranks with padded, uneven micro-batches.

The loss is a token sum over the window's all-ranks target count (times the world size,
since DDP averages). Training stops after a few updates, saves a checkpoint, and resumes
into freshly built model/optimizer/scheduler objects.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

SEED, VOCAB, D, MAXLEN = 21, 40, 32, 10
MICRO_BS, K, TOTAL_UPDATES, SPLIT_AT = 4, 3, 8, 4
PAD = -100
CKPT = "/tmp/wa87_a_c03_ckpt/state.ckpt"


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(MAXLEN, D)
        self.mix = nn.Linear(D, D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        h = self.tok(ids) + self.pos(pos)
        h = torch.cumsum(h, dim=1) / (pos + 1)[None, :, None]
        return self.head(torch.tanh(self.mix(h)))


def make_rank_data(rank, n_micro):
    g = torch.Generator().manual_seed(SEED * 1000 + rank)
    batches = []
    for _ in range(n_micro):
        ids = torch.randint(0, VOCAB, (MICRO_BS, MAXLEN), generator=g)
        lens = torch.randint(3, MAXLEN + 1, (MICRO_BS,), generator=g)
        labels = ids.roll(-1, dims=1).clone()
        mask = torch.arange(MAXLEN)[None, :] >= (lens[:, None] - 1)
        labels[mask] = PAD
        batches.append((ids, labels))
    return batches


def build(fabric):
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL_UPDATES, eta_min=5e-4)
    model, opt = fabric.setup(model, opt)
    return model, opt, sched


def train_updates(fabric, model, opt, sched, data, start, stop):
    world = fabric.world_size
    for update in range(start, stop):
        window = data[update * K:(update + 1) * K]
        local = torch.tensor(sum(int((lab != PAD).sum()) for _, lab in window), dtype=torch.float32)
        n_global = fabric.all_reduce(local, reduce_op="sum")
        for k, (ids, labels) in enumerate(window):
            with fabric.no_backward_sync(model, enabled=k < K - 1):
                logits = model(ids)
                tok_loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1),
                                           ignore_index=PAD, reduction="sum")
                fabric.backward(tok_loss * world / n_global)
        fabric.clip_gradients(model, opt, max_norm=1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        fabric.print(f"update {update} lr {sched.get_last_lr()[0]:.5f}")


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(SEED)
    data = make_rank_data(fabric.global_rank, TOTAL_UPDATES * K)

    model, opt, sched = build(fabric)
    train_updates(fabric, model, opt, sched, data, 0, SPLIT_AT)
    if fabric.global_rank == 0:
        os.makedirs(os.path.dirname(CKPT), exist_ok=True)
    fabric.barrier()
    fabric.save(CKPT, {"model": model, "optimizer": opt, "scheduler": sched.state_dict(), "update": SPLIT_AT})
    fabric.barrier()
    del model, opt, sched

    # "restart": fresh objects, then restore
    fabric.seed_everything(SEED + 1)
    model, opt, sched = build(fabric)
    state = {"model": model, "optimizer": opt, "scheduler": None, "update": 0}
    fabric.load(CKPT, state)
    sched.load_state_dict(state["scheduler"])
    train_updates(fabric, model, opt, sched, data, state["update"], TOTAL_UPDATES)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
