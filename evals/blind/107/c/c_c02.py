"""Next-token LM on padded sequences, DeepSpeed ZeRO-2 on two spawned CPU ranks.

Each window's loss is a token SUM normalised by the window's valid-token count over all
ranks (times the world size, which the engine's gradient average divides back out), so
DeepSpeed's own 1/GA scaling is switched off with scale_wrt_gas=False. Epochs hold 7
micro-batches per rank with GA 3, so each epoch ends in a one-micro-batch window; the loop
drives the accumulation boundary itself.

python c_c02.py
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
PORT = 49206
SEED = 5
VOCAB, DIM, SEQ = 40, 32, 10
MICRO_BATCH, GA = 4, 3
MICROS_PER_EPOCH, EPOCHS = 7, 3
PAD = -100


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.size(1)]
        h = torch.cumsum(h, dim=1) / torch.arange(1, ids.size(1) + 1).view(1, -1, 1)
        return self.head(torch.tanh(self.mix(h)))


def shard(rank, epoch):
    """Micro-batches for one rank and epoch; sequence lengths vary, so do token counts."""
    g = torch.Generator().manual_seed(SEED * 1000 + epoch * 10 + rank)
    out = []
    for _ in range(MICROS_PER_EPOCH):
        ids = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ), generator=g)
        lengths = torch.randint(3, SEQ + 1, (MICRO_BATCH,), generator=g)
        labels = ids.clone()
        labels[torch.arange(SEQ).view(1, -1) >= lengths.view(-1, 1)] = PAD
        out.append((ids, labels))
    return out


def windows(batches, k):
    for i in range(0, len(batches), k):
        yield batches[i:i + k]


def global_token_count(window):
    n = torch.tensor(sum(int((lab[:, 1:] != PAD).sum()) for _, lab in window), dtype=torch.float64)
    dist.all_reduce(n)
    return n.item()


def sha256_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(SEED)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    for epoch in range(EPOCHS):
        for window in windows(shard(rank, epoch), GA):
            n_tokens = global_token_count(window)
            for j, (ids, labels) in enumerate(window):
                engine.set_gradient_accumulation_boundary(j == len(window) - 1)
                logits = engine(ids)
                loss_sum = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                           ignore_index=PAD, reduction="sum")
                engine.backward(loss_sum * WORLD / n_tokens, scale_wrt_gas=False)
                engine.step()
        if rank == 0:
            print(f"epoch {epoch} optimizer steps {engine.global_steps}", flush=True)

    digest = sha256_params(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
