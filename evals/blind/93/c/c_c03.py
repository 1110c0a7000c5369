"""DPO on a tiny GRU policy with a frozen reference copy, 2 DDP ranks (torchrun).

A DistributedSampler + DataLoader with one worker process; 18 pairs per rank,
micro-batches of 4 (the last has 2), K = 2 -> windows of 2, 2 and 1 per epoch,
2 epochs.  The loss is the mean over the window's pairs on all ranks.
"""
import contextlib
import copy
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

VOCAB, SEQ, PROMPT, N_PAIRS, MICRO_BS, K, EPOCHS, BETA = 40, 12, 6, 36, 4, 2, 2, 0.2


class PairDataset(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(2024)
        prompt = torch.randint(1, VOCAB, (N_PAIRS, PROMPT), generator=g)
        self.chosen = torch.cat([prompt, (prompt + 1) % VOCAB], 1)
        self.rejected = torch.cat([prompt, torch.randint(1, VOCAB, (N_PAIRS, SEQ - PROMPT), generator=g)], 1)

    def __len__(self):
        return N_PAIRS

    def __getitem__(self, i):
        return self.chosen[i], self.rejected[i]


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 24)
        self.rnn = nn.GRU(24, 32, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens):
        """Summed log-prob of the response tokens of each sequence."""
        h, _ = self.rnn(self.emb(tokens[:, :-1]))
        logp = F.log_softmax(self.head(h), -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        return logp[:, PROMPT - 1:].sum(-1)


def main():
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(11)
    policy = Policy()
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    with torch.no_grad():  # start the policy slightly off the reference
        for p in policy.head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model = DDP(policy)
    optimizer = torch.optim.AdamW([
        {"params": policy.emb.parameters(), "lr": 5e-4, "weight_decay": 0.0},
        {"params": list(policy.rnn.parameters()) + list(policy.head.parameters()), "lr": 2e-3},
    ], weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))

    ds = PairDataset()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=sampler, num_workers=1)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches = list(loader)
        for w0 in range(0, len(batches), K):
            window = batches[w0:w0 + K]
            n_pairs = torch.tensor(float(sum(c.size(0) for c, _ in window)))
            dist.all_reduce(n_pairs)
            for i, (chosen, rejected) in enumerate(window):
                sync = i == len(window) - 1
                with contextlib.nullcontext() if sync else model.no_sync():
                    logp = model(torch.cat([chosen, rejected]))
                    with torch.no_grad():
                        ref = reference(torch.cat([chosen, rejected]))
                    b = chosen.size(0)
                    margin = BETA * ((logp[:b] - ref[:b]) - (logp[b:] - ref[b:]))
                    loss = -F.logsigmoid(margin).sum() * world / n_pairs
                    loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} steps {step} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in policy.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
