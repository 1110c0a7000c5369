"""Sequence-level distillation into a student whose vocabulary was resized, on 2 DDP ranks.

- the student was "pretrained" with 56 tokens and is resized to the teacher's 64
  (new rows initialised to the mean embedding), the student's embedding is frozen for the
  first 4 optimizer steps and then trained;
- the data comes through a DataLoader with a worker process, and the ranks use different
  micro-batch sizes (3 and 5) with padded, variable-length sequences;
- the loss of a window is the token-level CE against the teacher's greedy labels plus a
  KL term, summed over the window's valid tokens of all ranks, divided by that all-ranks
  count; DDP averages over ranks, so the loss is multiplied by the world size.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

OLD_VOCAB, VOCAB, SEQ, PAD = 56, 64, 18, 0
K = 3
STEPS = 8
UNFREEZE_AT = 4


class Student(nn.Module):
    def __init__(self, vocab, dim=40):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def resize_token_embeddings(self, new_vocab):
        old_e, old_o = self.embed, self.out
        self.embed = nn.Embedding(new_vocab, old_e.embedding_dim)
        self.out = nn.Linear(old_o.in_features, new_vocab)
        with torch.no_grad():
            n = old_e.num_embeddings
            self.embed.weight[:n] = old_e.weight
            self.embed.weight[n:] = old_e.weight.mean(0)
            self.out.weight[:n] = old_o.weight
            self.out.weight[n:] = old_o.weight.mean(0)
            self.out.bias[:n] = old_o.bias
            self.out.bias[n:] = old_o.bias.mean()

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        return self.out(h)


class Teacher(nn.Module):
    def __init__(self, dim=96):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=2, batch_first=True)
        self.out = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        return self.out(h)


class SynthText(Dataset):
    def __init__(self, rank, n):
        self.rank, self.n = rank, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(10_000 * self.rank + i)
        length = int(torch.randint(4, SEQ + 1, (1,), generator=g))
        ids = torch.full((SEQ,), PAD)
        ids[:length] = torch.randint(1, VOCAB, (length,), generator=g)
        return ids, length


def collate(items):
    ids = torch.stack([x for x, _ in items])
    lengths = torch.tensor([l for _, l in items])
    mask = torch.arange(SEQ)[None, :] < lengths[:, None]
    return ids, mask


def distill_sum(student, teacher, ids, mask, t=2.0):
    with torch.no_grad():
        t_logits = teacher(ids)
    s_logits = student(ids)
    ce = F.cross_entropy(s_logits.transpose(1, 2), t_logits.argmax(-1), reduction="none")
    kl = F.kl_div(F.log_softmax(s_logits / t, -1), F.log_softmax(t_logits / t, -1),
                  log_target=True, reduction="none").sum(-1) * t * t
    return ((0.5 * ce + 0.5 * kl) * mask).sum()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(3)
    teacher = Teacher().eval().requires_grad_(False)
    student = Student(OLD_VOCAB)
    student.resize_token_embeddings(VOCAB)
    student.embed.weight.requires_grad_(False)
    model = DDP(student)
    trainable = [p for n, p in student.named_parameters() if not n.startswith("embed.")]
    opt = torch.optim.AdamW(trainable, lr=2e-3, weight_decay=0.01)

    micro_bs = 3 if rank == 0 else 5
    loader = DataLoader(SynthText(rank, micro_bs * K * STEPS), batch_size=micro_bs, shuffle=False,
                        num_workers=1, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    for step in range(STEPS):
        if step == UNFREEZE_AT:
            student.embed.weight.requires_grad_(True)
            opt.add_param_group({"params": [student.embed.weight], "lr": 5e-4, "weight_decay": 0.0})
            # DDP must know about the newly trainable parameter
            model = DDP(student)
        window = [next(it) for _ in range(K)]
        n_tok = torch.tensor(float(sum(int(m.sum()) for _, m in window)))
        dist.all_reduce(n_tok)
        for k, (ids, mask) in enumerate(window):
            model.require_backward_grad_sync = k == K - 1
            loss = distill_sum(model, teacher, ids, mask) * world / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in student.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 2 == 0:
            print(f"step {step} tokens {int(n_tok)} loss/rank {loss.item():.4f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in student.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
