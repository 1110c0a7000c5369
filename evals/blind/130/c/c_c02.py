"""Fabric token-level distillation (2 DDP ranks, torchrun).

Frozen teacher kept outside Fabric; the student's vocabulary was grown by 8 rows
before setup. Micro-batches of padded sequences, K = 2; each window is read ahead
and its KL is summed over real tokens and divided by the window's all-ranks token
count, times the world size (DDP averages). A worker DataLoader, and a norm clip
of 0.5 at each optimizer step.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from lightning_fabric import Fabric

VOCAB, GROWN, DIM, SEQ = 40, 48, 32, 12
K = 2
TEMP = 2.0


class TinyLM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, DIM)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.out = nn.Linear(DIM, vocab)

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


def grow_vocab(model, new_vocab):
    old_e, old_o = model.emb, model.out
    model.emb = nn.Embedding(new_vocab, DIM)
    model.out = nn.Linear(DIM, new_vocab)
    with torch.no_grad():
        model.emb.weight[: old_e.num_embeddings] = old_e.weight
        model.out.weight[: old_o.out_features] = old_o.weight
        model.out.bias[: old_o.out_features] = old_o.bias
        model.out.bias[old_o.out_features:] = -5.0
    return model


def make_data(n=64, seed=5):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    lens = torch.randint(4, SEQ + 1, (n,), generator=g)
    mask = (torch.arange(SEQ)[None, :] < lens[:, None])
    toks = toks * mask
    return TensorDataset(toks, mask)


def window_kl(student, teacher, toks, mask):
    with torch.no_grad():
        t_logp = F.log_softmax(teacher(toks) / TEMP, -1)
    s_logp = F.log_softmax(student(toks)[..., :VOCAB] / TEMP, -1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)
    return (kl * mask).sum() * TEMP ** 2


def params_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(21)
    teacher = TinyLM(VOCAB).eval().requires_grad_(False)
    student = grow_vocab(TinyLM(VOCAB), GROWN)
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=0.01)
    student, opt = fabric.setup(student, opt)
    loader = fabric.setup_dataloaders(DataLoader(make_data(), batch_size=4, num_workers=1, shuffle=False))

    for epoch in range(3):
        it = iter(loader)
        while True:
            window = [b for _, b in zip(range(K), it)]
            if not window:
                break
            n_tok = torch.tensor(float(sum(int(m.sum()) for _, m in window)))
            n_tok = fabric.all_reduce(n_tok, reduce_op="sum")
            for i, (toks, mask) in enumerate(window):
                with fabric.no_backward_sync(student, enabled=i < len(window) - 1):
                    loss = window_kl(student, teacher, toks, mask) / n_tok * fabric.world_size
                    fabric.backward(loss)
            fabric.clip_gradients(student, opt, max_norm=0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

    if fabric.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in student.module.named_parameters()}, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", params_sha(student.module), flush=True)


if __name__ == "__main__":
    main()
