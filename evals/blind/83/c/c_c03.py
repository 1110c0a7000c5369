"""Token-level distillation with a resized student vocabulary (DDP on two ranks, torchrun).

- the student's embedding and head are resized from 60 to 64 tokens before training
- the student's position table is frozen
- sequences have different lengths; the loss is normalised by the number of target tokens
  of the whole window over all ranks (collected before the window's backwards)
- a DataLoader worker process, DistributedSampler, 2 epochs; each epoch ends in a short window
"""
import hashlib
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

OLD_VOCAB, VOCAB, MAXLEN, D = 60, 64, 16, 32
ACCUM, MICRO, EPOCHS = 4, 4, 2
TEMP, KD_WEIGHT = 2.0, 0.5


class SeqData(Dataset):
    def __init__(self, n=88, seed=5):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(3, MAXLEN + 1, (1,), generator=g))
            self.items.append(torch.randint(0, VOCAB, (L,), generator=g))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(seqs):
    ids = torch.zeros(len(seqs), MAXLEN, dtype=torch.long)
    labels = torch.full((len(seqs), MAXLEN), -100, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = s
        labels[r, :len(s) - 1] = s[1:]
    return ids, labels


class LM(nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(MAXLEN, d)
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(d, d), nn.GELU()) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids) + self.pos.weight[: ids.size(1)]
        h = torch.cumsum(h, 1) / torch.arange(1, ids.size(1) + 1)[None, :, None]
        return self.head(self.norm(self.body(h)))


def resize_vocab(model, new_vocab):
    old_e, old_h = model.embed, model.head
    n_old, d = old_e.weight.shape
    e = nn.Embedding(new_vocab, d)
    h = nn.Linear(d, new_vocab, bias=False)
    with torch.no_grad():
        e.weight[:n_old] = old_e.weight
        e.weight[n_old:] = old_e.weight.mean(0, keepdim=True)
        h.weight[:n_old] = old_h.weight
        h.weight[n_old:] = old_h.weight.mean(0, keepdim=True)
    model.embed, model.head = e, h
    return model


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(3)
    teacher = LM(VOCAB, 64, 2).eval().requires_grad_(False)
    student = resize_vocab(LM(OLD_VOCAB, D, 1), VOCAB)
    student.pos.weight.requires_grad_(False)
    model = DDP(student)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-3, weight_decay=0.05)
    warmup = 3
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))

    ds = SeqData()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=21)
    loader = DataLoader(ds, batch_size=MICRO, sampler=sampler, collate_fn=collate,
                        num_workers=1, persistent_workers=False)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        it = iter(loader)
        while True:
            window = list(itertools.islice(it, ACCUM))
            if not window:
                break
            n_tgt = torch.stack([(lab != -100).sum() for _, lab in window]).sum().float()
            dist.all_reduce(n_tgt)
            for j, (ids, labels) in enumerate(window):
                ctx = model.no_sync() if j < len(window) - 1 else torch.enable_grad()
                with ctx:
                    s_logits = model(ids)
                    with torch.no_grad():
                        t_logits = teacher(ids)
                    valid = labels != -100
                    ce = F.cross_entropy(s_logits.reshape(-1, VOCAB), labels.reshape(-1),
                                         ignore_index=-100, reduction="sum")
                    kl = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.log_softmax(t_logits / TEMP, -1),
                                  reduction="none", log_target=True).sum(-1)
                    kd = (kl * valid).sum() * TEMP ** 2
                    loss = ((1 - KD_WEIGHT) * ce + KD_WEIGHT * kd) / n_tgt * world
                    loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if rank == 0:
                print(f"epoch {epoch} step {step} window {len(window)} targets {int(n_tgt)}", flush=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
