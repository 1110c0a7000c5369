"""Token-level distillation into a student whose vocabulary was grown by 8 tokens.

- teacher: frozen, original vocabulary; student: embedding and output head resized
  (old rows copied) before DDP wraps it, sinusoidal-like position table frozen
- two optimizers: AdamW for the body, SGD for the (grown) embedding
- a DataLoader with one worker yields padded micro-batches of uneven lengths
- loss: KL summed over real tokens, divided by the window's token count on all
  ranks, times W (DDP averages); the teacher's distribution is padded with zeros
  over the student's extra tokens
"""
import hashlib
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

BASE_VOCAB, NEW_TOKENS, D, MAXLEN = 50, 8, 32, 16
MICRO, K, STEPS, SEED = 4, 3, 20, 11


class LM(nn.Module):
    def __init__(self, vocab, d=D):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        pos = torch.arange(MAXLEN).unsqueeze(1) / torch.pow(100.0, torch.arange(d) / d)
        self.pos = nn.Parameter(torch.where(torch.arange(d) % 2 == 0, pos.sin(), pos.cos()))
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        h = self.emb(ids) + self.pos[: ids.shape[1]]
        h = h + self.ff(h)
        return self.head(self.norm(h))


def resize_vocab(model, new_vocab):
    old_emb, old_head = model.emb, model.head
    emb = nn.Embedding(new_vocab, old_emb.embedding_dim)
    head = nn.Linear(old_head.in_features, new_vocab)
    with torch.no_grad():
        emb.weight[: old_emb.num_embeddings] = old_emb.weight
        emb.weight[old_emb.num_embeddings:] = old_emb.weight.mean(0, keepdim=True)
        head.weight[: old_head.out_features] = old_head.weight
        head.bias[: old_head.out_features] = old_head.bias
        head.bias[old_head.out_features:] = -4.0
    model.emb, model.head = emb, head
    return model


class Docs(Dataset):
    def __init__(self, rank, n):
        self.rank, self.n = rank, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(SEED * 100003 + self.rank * 7919 + i)
        length = int(torch.randint(3, MAXLEN + 1, (1,), generator=g))
        return torch.randint(0, BASE_VOCAB, (length,), generator=g)


def collate(docs):
    ids = torch.zeros(len(docs), MAXLEN, dtype=torch.long)
    mask = torch.zeros(len(docs), MAXLEN)
    for i, d in enumerate(docs):
        ids[i, : len(d)] = d
        mask[i, : len(d)] = 1.0
    return ids, mask


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(SEED)

    teacher = LM(BASE_VOCAB).eval().requires_grad_(False)
    student = resize_vocab(LM(BASE_VOCAB, D), BASE_VOCAB + NEW_TOKENS)
    student.pos.requires_grad_(False)
    model = DDP(student)

    body = [p for n, p in student.named_parameters() if p.requires_grad and not n.startswith("emb.")]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.01)
    opt_emb = torch.optim.SGD(student.emb.parameters(), lr=0.5, momentum=0.9)
    optimizers = (opt_body, opt_emb)

    loader = DataLoader(Docs(rank, MICRO * K * STEPS), batch_size=MICRO, shuffle=False,
                        num_workers=1, collate_fn=collate)
    it = iter(loader)
    for step in range(STEPS):
        window = [next(it) for _ in range(K)]
        n_tok = torch.tensor(float(sum(m.sum() for _, m in window)))
        dist.all_reduce(n_tok)
        for k, (ids, mask) in enumerate(window):
            ctx = model.no_sync() if k < K - 1 else torch.enable_grad()
            with ctx:
                with torch.no_grad():
                    t_prob = F.softmax(teacher(ids) / 2.0, -1)
                    t_prob = F.pad(t_prob, (0, NEW_TOKENS))
                s_logp = F.log_softmax(model(ids) / 2.0, -1)
                kl = (t_prob * (t_prob.clamp_min(1e-12).log() - s_logp)).sum(-1)
                loss = (kl * mask).sum() * 4.0 / n_tok * world
                loss.backward()
        for o in optimizers:
            o.step()
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        if rank == 0 and (step + 1) % 5 == 0:
            print(f"step {step + 1} kl/token {loss.item() / world * n_tok.item() / (mask.sum().item() * 4.0):.4f}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
