"""Logit distillation on spawned ranks with a hand-rolled, bucketed gradient all-reduce.

Frozen teacher, student with a frozen position table and a vocabulary resized from 48
to 56 rows (new rows never see a target, they only get softmax gradient). Forward under
bf16 autocast, fp32 parameters and gradients. K = 3 micro-batches per update, one flat
all-reduce per window, then a global-norm clip on the averaged gradient.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

WORLD, PORT, SEED = 2, 39261, 21
K, STEPS, MB, T = 3, 12, 4, 10
OLD_V, NEW_V, D = 48, 56, 32
TEMP, ALPHA = 2.0, 0.7


class LM(nn.Module):
    def __init__(self, vocab, dim, n_pos=T):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(n_pos, dim)
        self.body = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.emb(x) + self.pos(torch.arange(x.size(1)))
        h = h + self.body(h)
        return self.out(self.norm(h))


def resize_vocab(model, new_v):
    old_emb, old_out = model.emb, model.out
    emb = nn.Embedding(new_v, old_emb.embedding_dim)
    out = nn.Linear(old_out.in_features, new_v)
    with torch.no_grad():
        emb.weight[: old_emb.num_embeddings] = old_emb.weight
        emb.weight[old_emb.num_embeddings:] = old_emb.weight.mean(0)
        out.weight[: old_out.out_features] = old_out.weight
        out.weight[old_out.out_features:] = 0.0
        out.bias[: old_out.out_features] = old_out.bias
        out.bias[old_out.out_features:] = -2.0
    model.emb, model.out = emb, out


class BucketAllReduce:
    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]

    def __call__(self):
        grads = [p.grad for p in self.params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)


def kd_loss(s_logits, t_logits, targets):
    s = s_logits[..., :OLD_V].float()
    kl = F.kl_div(F.log_softmax(s / TEMP, -1), F.log_softmax(t_logits.float() / TEMP, -1),
                  log_target=True, reduction="none").sum(-1).mean() * TEMP ** 2
    ce = F.cross_entropy(s_logits.float().flatten(0, 1), targets.flatten())
    return ALPHA * kl + (1 - ALPHA) * ce


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    teacher = LM(OLD_V, 64).eval().requires_grad_(False)
    student = LM(OLD_V, D)
    resize_vocab(student, NEW_V)
    student.pos.weight.requires_grad_(False)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    sync = BucketAllReduce(student.parameters())
    gen = torch.Generator().manual_seed(SEED * 1000 + rank)

    for step in range(STEPS):
        for micro in range(K):
            x = torch.randint(0, OLD_V, (MB, T + 1), generator=gen)
            inp, tgt = x[:, :-1], x[:, 1:]
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                t_logits = teacher(inp)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                s_logits = student(inp)
            loss = kd_loss(s_logits, t_logits, tgt) / K
            loss.backward()
        sync()
        gnorm = nn.utils.clip_grad_norm_(params, 0.15)
        opt.step()
        opt.zero_grad(set_to_none=False)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item() * K:.4f} grad_norm {gnorm:.3f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD)
