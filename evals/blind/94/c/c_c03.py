"""CTC speech-style recogniser on synthetic feature sequences, DDP on spawned ranks.

A DataLoader with a worker process and a DistributedSampler feeds variable-length
utterances. Each window (K = 3 micro-batches) is drawn ahead so its all-ranks target
count is known; the CTC sum is divided by it and multiplied by the world size (DDP
averages). Forward under bfloat16 autocast, the CTC loss in float32. The convolutional
front end is frozen. 10 micro-batches per rank per epoch: windows of 3, 3, 3 and 1.
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

WORLD = 2
PORT = 47209
N_FEAT, N_TOKENS = 16, 12  # token 0 is the CTC blank
BATCH, K, EPOCHS = 4, 3, 3
DATASET_SIZE = 80
LR, CLIP = 2e-3, 1.0


class SyntheticSpeech(Dataset):
    def __init__(self, n):
        self.n = n
        self.codebook = torch.randn(N_TOKENS, N_FEAT, generator=torch.Generator().manual_seed(3))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(9000 + i)
        L = int(torch.randint(2, 7, (1,), generator=g))
        tgt = torch.randint(1, N_TOKENS, (L,), generator=g)
        reps = torch.randint(2, 5, (L,), generator=g)
        frames = self.codebook[tgt].repeat_interleave(reps, dim=0)
        frames = frames + 0.3 * torch.randn(frames.shape, generator=g)
        return frames, tgt


def collate(items):
    feats, tgts = zip(*items)
    in_lens = torch.tensor([f.shape[0] for f in feats])
    tgt_lens = torch.tensor([t.shape[0] for t in tgts])
    x = nn.utils.rnn.pad_sequence(feats, batch_first=True)
    return x, in_lens, torch.cat(tgts), tgt_lens


class Recogniser(nn.Module):
    def __init__(self):
        super().__init__()
        self.frontend = nn.Conv1d(N_FEAT, 32, 3, padding=1)
        self.encoder = nn.Sequential(nn.Conv1d(32, 64, 5, padding=2), nn.GELU(), nn.Conv1d(64, 64, 5, padding=2), nn.GELU())
        self.classifier = nn.Linear(64, N_TOKENS)

    def forward(self, x):
        h = self.encoder(F.gelu(self.frontend(x.transpose(1, 2))))
        return self.classifier(h.transpose(1, 2))


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    net = Recogniser()
    net.frontend.requires_grad_(False)
    model = DDP(net)
    groups = [
        {"params": [p for n, p in net.named_parameters() if p.requires_grad and p.dim() > 1], "weight_decay": 0.05},
        {"params": [p for n, p in net.named_parameters() if p.requires_grad and p.dim() <= 1], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR)
    ds = SyntheticSpeech(DATASET_SIZE)
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=17)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate, num_workers=1)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        it = iter(loader)
        while True:
            window = []
            for _ in range(K):
                b = next(it, None)
                if b is None:
                    break
                window.append(b)
            if not window:
                break
            n_tgt = torch.tensor(float(sum(int(b[3].sum()) for b in window)))
            dist.all_reduce(n_tgt)
            for j, (x, in_lens, tgts, tgt_lens) in enumerate(window):
                sync = j == len(window) - 1
                with (nullcontext() if sync else model.no_sync()):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        logits = model(x)
                    logp = F.log_softmax(logits.float(), -1).transpose(0, 1)
                    loss = F.ctc_loss(logp, tgts, in_lens, tgt_lens, blank=0, reduction="sum", zero_infinity=True)
                    (loss * WORLD / n_tgt).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
