"""CTC acoustic model on 2 DDP ranks (torchrun), uneven utterances, bf16 autocast.

Micro-batches hold different numbers of utterances of different lengths. The
objective is the CTC negative log-likelihood summed over every utterance of the
window (all ranks), divided by the window's total number of target labels.
Each epoch has 10 micro-batches per rank with K = 4, so the last window of an
epoch holds 2 micro-batches; its normaliser is counted over those 2 only.
The clip acts on the full window's gradient, after the sync.
"""
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

N_MELS = 12
VOCAB = 10  # 0 = blank
K = 4
MICRO_PER_EPOCH = 10
EPOCHS = 2
MAX_NORM = 0.5


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(N_MELS, 32, 3, padding=1)
        self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(64, VOCAB)

    def forward(self, feats):  # feats: B x T x N_MELS
        x = torch.relu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        x, _ = self.rnn(x)
        return self.proj(x)


def make_epoch(rank, epoch):
    g = torch.Generator().manual_seed(500 + 37 * epoch + rank)
    batches = []
    for i in range(MICRO_PER_EPOCH):
        b = int(torch.randint(2, 6, (1,), generator=g))
        T = torch.randint(20, 41, (b,), generator=g)
        L = torch.clamp(T // 5 - torch.randint(0, 3, (b,), generator=g), min=1)
        feats = torch.zeros(b, int(T.max()), N_MELS)
        targets = torch.zeros(b, int(L.max()), dtype=torch.long)
        for j in range(b):
            lab = torch.randint(1, VOCAB, (int(L[j]),), generator=g)
            targets[j, : L[j]] = lab
            frames = lab.repeat_interleave(int(T[j]) // int(L[j]) + 1)[: T[j]]
            feats[j, : T[j]] = torch.nn.functional.one_hot(frames, N_MELS).float() + 0.3 * torch.randn(int(T[j]), N_MELS, generator=g)
        batches.append((feats, targets, T, L))
    return batches


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Encoder()
    ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ctc = nn.CTCLoss(blank=0, reduction="sum", zero_infinity=True)

    for epoch in range(EPOCHS):
        batches = make_epoch(rank, epoch)
        for w0 in range(0, MICRO_PER_EPOCH, K):
            window = batches[w0: w0 + K]
            n_labels = torch.tensor(float(sum(int(b[3].sum()) for b in window)))
            dist.all_reduce(n_labels)
            opt.zero_grad(set_to_none=True)
            for i, (feats, targets, T, L) in enumerate(window):
                sync = i == len(window) - 1
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        logits = ddp(feats)
                    logp = torch.log_softmax(logits.float(), -1).transpose(0, 1)
                    loss = ctc(logp, targets, T, L) * world / n_labels
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
