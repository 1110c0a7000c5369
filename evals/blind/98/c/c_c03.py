"""Bradley-Terry reward model on DDP (torchrun) with a worker DataLoader.

- the token embedding is resized from 30 to 34 rows (new special tokens), old rows copied
- the first projection layer is frozen
- tied pairs (equal preference score) are masked out, so every micro-batch and every
  rank has a different number of usable pairs; the window (read ahead from the
  loader) is normalised by the all-ranks usable-pair count, x W for DDP's mean
- 30 pairs per rank, micro-batch 4 -> 8 micro-batches (last holds 2), K = 3 -> 3, 3, 2
- linear warm-up then constant, stepped once per optimizer step
"""
import argparse
import hashlib
import itertools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

OLD_VOCAB, NEW_VOCAB, SEQ, DIM = 30, 34, 10, 32


class PairDataset(Dataset):
    def __init__(self, n=60, seed=4):
        g = torch.Generator().manual_seed(seed)
        self.chosen = torch.randint(0, NEW_VOCAB, (n, SEQ), generator=g)
        self.rejected = torch.randint(0, NEW_VOCAB, (n, SEQ), generator=g)
        self.score_c = torch.randint(0, 3, (n,), generator=g)
        self.score_r = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.chosen)

    def __getitem__(self, i):
        c, r = self.chosen[i], self.rejected[i]
        sc, sr = self.score_c[i], self.score_r[i]
        if sr > sc:
            c, r = r, c
        return {"chosen": c, "rejected": r, "valid": (sc != sr).float()}


class RewardModel(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.proj1 = nn.Linear(DIM, DIM)
        self.proj2 = nn.Linear(DIM, DIM)
        self.score = nn.Linear(DIM, 1)

    def resize_token_embeddings(self, new_vocab):
        old = self.embed
        new = nn.Embedding(new_vocab, DIM)
        with torch.no_grad():
            new.weight[: old.num_embeddings] = old.weight
            new.weight[old.num_embeddings:] = old.weight.mean(0, keepdim=True)
        self.embed = new

    def forward(self, ids):
        h = torch.tanh(self.proj1(self.embed(ids)))
        h = torch.tanh(self.proj2(h)).mean(1)
        return self.score(h).squeeze(-1)


def windows(loader, k):
    it = iter(loader)
    while True:
        w = list(itertools.islice(it, k))
        if not w:
            return
        yield w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--micro_batch_size", type=int, default=4)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=3)
    ap.add_argument("--learning_rate", type=float, default=5e-3)
    ap.add_argument("--warmup_steps", type=int, default=2)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(21)

    model = RewardModel(OLD_VOCAB)
    model.resize_token_embeddings(NEW_VOCAB)
    model.proj1.requires_grad_(False)
    ddp = DDP(model)

    ds = PairDataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=8)
    loader = DataLoader(ds, batch_size=args.micro_batch_size, sampler=sampler,
                        num_workers=1, persistent_workers=False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=args.learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / args.warmup_steps))

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for window in windows(loader, args.gradient_accumulation_steps):
            n_pairs = torch.tensor(sum(float(b["valid"].sum()) for b in window))
            dist.all_reduce(n_pairs)
            n_pairs = n_pairs.clamp(min=1.0)
            for j, batch in enumerate(window):
                ids = torch.cat([batch["chosen"], batch["rejected"]])
                if j < len(window) - 1:
                    with ddp.no_sync():
                        r = ddp(ids)
                        rc, rr = r.chunk(2)
                        loss = -(F.logsigmoid(rc - rr) * batch["valid"]).sum() / n_pairs * world
                        loss.backward()
                else:
                    r = ddp(ids)
                    rc, rr = r.chunk(2)
                    loss = -(F.logsigmoid(rc - rr) * batch["valid"]).sum() / n_pairs * world
                    loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
