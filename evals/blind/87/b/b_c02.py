# FSDP2 on ranks spawned by this script: padded sequences of uneven length, a loss
# normalised by the window's valid-token count over all ranks, an epoch whose last
# window is short, and a gradient-norm clip on the sharded (DTensor) gradients.
import hashlib, os
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

PORT = 39109
VOCAB, DIM, MAXLEN, MICRO, K, EPOCHS, BATCHES_PER_EPOCH = 40, 32, 14, 3, 3, 2, 7
IGNORE = -100


class MLPLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.SiLU(), nn.Linear(2 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        return self.head(h + self.mix(h))


def make_batch(epoch, b, rank):
    g = torch.Generator().manual_seed(epoch * 997 + b * 31 + rank * 7)
    x = torch.randint(0, VOCAB, (MICRO, MAXLEN), generator=g)
    y = (x * 5 + 3) % VOCAB
    lens = torch.randint(2, MAXLEN + 1, (MICRO,), generator=g)
    pad = torch.arange(MAXLEN)[None, :] >= lens[:, None]
    y = y.masked_fill(pad, IGNORE)
    return x, y


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = MLPLM()
    fully_shard(model.mix)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)

    for epoch in range(EPOCHS):
        batches = [make_batch(epoch, b, rank) for b in range(BATCHES_PER_EPOCH)]
        for w0 in range(0, BATCHES_PER_EPOCH, K):
            window = batches[w0:w0 + K]
            n_tok = torch.tensor([sum(int((y != IGNORE).sum()) for _, y in window)], dtype=torch.float64)
            dist.all_reduce(n_tok)
            for j, (x, y) in enumerate(window):
                model.set_requires_gradient_sync(j == len(window) - 1)
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                       ignore_index=IGNORE, reduction="sum")
                (loss * world / n_tok.item()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.8)
            opt.step()
            opt.zero_grad()

    chunks = [p.full_tensor().detach().float().numpy().tobytes() for _, p in model.named_parameters()]
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(b"".join(chunks)).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
