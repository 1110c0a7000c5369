"""Token-level distillation with Lightning Fabric on 2 CPU ranks (DDP), K = 3.

Rank 0 gets 3 sequences per micro-batch, rank 1 gets 5; prompt tokens are masked out.
The frozen teacher is never passed to `fabric.setup` (it only runs under no_grad).
Each window's loss is a sum over its completion tokens divided by the window's token
count over all ranks, times the world size (DDP averages over ranks).
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

VOCAB, T, K, STEPS, TEMP, ALPHA = 48, 12, 3, 10, 2.0, 0.5


class LM(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


def make_micro_batch(gen, rows):
    x = torch.randint(0, VOCAB, (rows, T + 1), generator=gen)
    prompt_len = torch.randint(3, 8, (rows,), generator=gen)
    mask = torch.arange(T)[None, :] >= prompt_len[:, None]  # completion tokens only
    return x[:, :-1], x[:, 1:], mask


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    teacher = LM(64).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    torch.manual_seed(1)
    student = LM(32)
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=0.01)
    student, opt = fabric.setup(student, opt)

    W = fabric.world_size
    rows = 3 if fabric.global_rank == 0 else 5
    gen = torch.Generator().manual_seed(10 + fabric.global_rank)

    for step in range(STEPS):
        window = [make_micro_batch(gen, rows) for _ in range(K)]
        local_tokens = torch.tensor(float(sum(m.sum() for _, _, m in window)))
        window_tokens = fabric.all_reduce(local_tokens, reduce_op="sum")
        for i, (x, y, mask) in enumerate(window):
            with fabric.no_backward_sync(student, enabled=i < K - 1):
                logits = student(x)
                with torch.no_grad():
                    t_logits = teacher(x)
                kd = F.kl_div(F.log_softmax(logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                              log_target=True, reduction="none").sum(-1) * TEMP ** 2
                ce = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
                per_tok = ALPHA * kd + (1 - ALPHA) * ce
                loss = (per_tok * mask).sum() / window_tokens * W
                fabric.backward(loss)
        fabric.clip_gradients(student, opt, max_norm=0.5)
        opt.step()
        opt.zero_grad()

    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in student.module.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
