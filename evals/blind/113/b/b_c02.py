"""Token-level distillation with Lightning Fabric on 2 ranks, launched by Fabric itself.

A frozen teacher (kept outside DDP) and a student whose encoder trains with AdamW
and whose output head trains with SGD + momentum. Variable-length sequences; the
KL over a window is summed and divided by the window's valid-token count over all
ranks (times the world size, since DDP averages). K = 3 with 8 micro-batches per
rank and epoch: windows of 3, 3 and 2. Each optimizer clips its own parameters.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import lightning_fabric as L

SEED, VOCAB, DIM, K, EPOCHS, TAU = 5, 64, 32, 3, 2, 2.0


class TinyLM(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.tok(ids))
        return self.head(h)


class Sequences(Dataset):
    def __init__(self, n=32):
        g = torch.Generator().manual_seed(SEED + 100)
        self.seqs = [torch.randint(1, VOCAB, (int(torch.randint(4, 15, (1,), generator=g)),), generator=g)
                     for _ in range(n)]

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i]


def collate(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = True
    return ids, mask


def kd_sum(student_logits, teacher_logits, mask):
    s = F.log_softmax(student_logits / TAU, -1)
    t = F.log_softmax(teacher_logits / TAU, -1)
    per_tok = (t.exp() * (t - s)).sum(-1) * TAU * TAU
    return per_tok[mask].sum()


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def run(fabric):
    fabric.seed_everything(SEED)
    teacher = TinyLM(48).eval().requires_grad_(False)
    student = TinyLM(DIM)
    body = [p for n, p in student.named_parameters() if not n.startswith("head.")]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(student.head.parameters(), lr=0.2, momentum=0.9)
    student, opt_body, opt_head = fabric.setup(student, opt_body, opt_head)
    teacher = fabric.to_device(teacher)

    loader = fabric.setup_dataloaders(DataLoader(Sequences(), batch_size=2, shuffle=True, collate_fn=collate))
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        batches = list(loader)
        for start in range(0, len(batches), K):
            window = batches[start:start + K]
            n_tok = fabric.all_reduce(sum(m.sum() for _, m in window).float(), reduce_op="sum")
            for j, (ids, mask) in enumerate(window):
                with fabric.no_backward_sync(student, enabled=j < len(window) - 1):
                    with torch.no_grad():
                        t_logits = teacher(ids)
                    loss = kd_sum(student(ids), t_logits, mask) * fabric.world_size / n_tok
                    fabric.backward(loss)
            fabric.clip_gradients(student, opt_body, max_norm=0.5)
            fabric.clip_gradients(student, opt_head, max_norm=0.5)
            opt_body.step()
            opt_head.step()
            opt_body.zero_grad()
            opt_head.zero_grad()

    fabric.barrier()
    if fabric.global_rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in student.module.named_parameters()},
                       os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(student.module)}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "49151"
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn", precision="32-true")
    fabric.launch(run)
