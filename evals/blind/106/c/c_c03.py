"""Token-level distillation on 2 spawned ranks without DDP.

Gradients are accumulated locally and summed across ranks with one flat
all-reduce per window; every loss term is a sum divided by the window's
all-ranks count (tokens for CE/KD, sequences for the hidden-state hint).
Student (AdamW) and hint projector (SGD + momentum) have their own optimizers;
forwards run under bf16 autocast, parameters and gradients stay fp32.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

PORT = 49209
WORLD = 2
VOCAB, D_S, D_T, MAXLEN = 50, 32, 64, 14
ACCUM, MICRO_BS, STEPS = 2, 4, 14
TEMP, W_KD, W_HINT = 2.0, 0.5, 0.2


class TinyLM(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(MAXLEN, d) * 0.02)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.out = nn.Linear(d, VOCAB)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        h = h + self.mlp(torch.cumsum(h, 1) / torch.arange(1, ids.shape[1] + 1)[None, :, None])
        return self.out(h), h


def micro_batches(rank, step):
    """Uneven lengths: each sequence has its own number of valid target tokens."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    for _ in range(ACCUM):
        ids = torch.randint(0, VOCAB, (MICRO_BS, MAXLEN), generator=g)
        lens = torch.randint(4, MAXLEN + 1, (MICRO_BS,), generator=g)
        mask = (torch.arange(MAXLEN)[None] < lens[:, None]).float()
        labels = torch.roll(ids, -1, 1)
        mask[:, -1] = 0.0
        yield ids, labels, mask


class Distiller:
    def __init__(self, rank):
        self.rank = rank
        torch.manual_seed(0)
        self.teacher = TinyLM(D_T).requires_grad_(False).eval()
        self.student = TinyLM(D_S)
        self.proj = nn.Linear(D_S, D_T)
        self.opt_s = torch.optim.AdamW(self.student.parameters(), lr=2e-3, weight_decay=0.01)
        self.opt_p = torch.optim.SGD(self.proj.parameters(), lr=0.05, momentum=0.9)
        self.params = list(self.student.parameters()) + list(self.proj.parameters())

    def window_counts(self, window):
        c = torch.stack([sum(m.sum() for _, _, m in window),
                         sum((m.sum(1) > 0).float().sum() for _, _, m in window)])
        dist.all_reduce(c)
        return c[0], c[1]

    def loss_sums(self, ids, labels, mask):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            t_logits, t_h = self.teacher(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            s_logits, s_h = self.student(ids)
            hint_pred = self.proj(s_h)
        s_logits, t_logits = s_logits.float(), t_logits.float()
        ce = F.cross_entropy(s_logits.transpose(1, 2), labels, reduction="none")
        kd = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                      log_target=True, reduction="none").sum(-1) * TEMP ** 2
        tok = ((1 - W_KD) * ce + W_KD * kd) * mask
        per_seq_hint = (((hint_pred.float() - t_h.float()) ** 2).mean(-1) * mask).sum(1) / mask.sum(1).clamp_min(1)
        return tok.sum(), per_seq_hint.sum()

    def all_reduce_grads(self):
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # SUM: losses are already normalised by all-ranks counts
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def train(self):
        for step in range(STEPS):
            window = list(micro_batches(self.rank, step))
            n_tok, n_seq = self.window_counts(window)
            for ids, labels, mask in window:
                tok_sum, hint_sum = self.loss_sums(ids, labels, mask)
                (tok_sum / n_tok + W_HINT * hint_sum / n_seq).backward()
            self.all_reduce_grads()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt_s.step()
            self.opt_p.step()
            self.opt_s.zero_grad(set_to_none=True)
            self.opt_p.zero_grad(set_to_none=True)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class Bundle(nn.Module):
    def __init__(self, d: Distiller):
        super().__init__()
        self.student, self.proj = d.student, d.proj


def worker(rank):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{PORT}", rank=rank, world_size=WORLD)
    d = Distiller(rank)
    d.train()
    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(Bundle(d))}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
