"""Masked-token SFT on a DeepSpeed ZeRO-1 engine with caller-owned accumulation
(`managed_gradient_accumulation: false`), ranks spawned by the script itself.

Responses have ragged lengths, so each window is normalised by its all-ranks count of
response tokens (read ahead, all-reduced), times W because ZeRO averages over ranks; the
engine's own 1/K is switched off with scale_wrt_gas=False. Epochs hold 8 micro-batches
per rank, so with K = 3 the windows are 3, 3, 2 and `step()` closes each one.
"""
import hashlib
import os
import sys

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

WORLD, PORT = 2, 49019
K, MICRO_BS, SEQ, VOCAB = 3, 4, 20, 50
EPOCHS, PER_EPOCH = 3, 8
IGNORE = -100


class TinyDecoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, idx):
        return self.head(self.rnn(self.emb(idx))[0])


def sample_micro_batch(epoch, i, rank):
    g = torch.Generator().manual_seed(4242 + 1000 * epoch + 10 * i + rank)
    x = torch.randint(1, VOCAB, (MICRO_BS, SEQ + 1), generator=g)
    x[:, 1:] = torch.where(torch.rand(MICRO_BS, SEQ, generator=g) < 0.6, (x[:, :-1] + 7) % VOCAB, x[:, 1:])
    labels = x[:, 1:].clone()
    prompt = torch.randint(3, 9, (MICRO_BS, 1), generator=g)
    length = torch.randint(10, SEQ + 1, (MICRO_BS, 1), generator=g)
    pos = torch.arange(SEQ).unsqueeze(0)
    labels[(pos < prompt) | (pos >= length)] = IGNORE
    return x[:, :-1], labels


def worker(rank, dump):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    deepspeed.init_distributed(dist_backend="gloo")

    torch.manual_seed(0)
    model = TinyDecoder()
    opt = torch.optim.Adam(model.parameters(), lr=4e-3)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BS,
        "gradient_accumulation_steps": K,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10**6,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    for epoch in range(EPOCHS):
        batches = [sample_micro_batch(epoch, i, rank) for i in range(PER_EPOCH)]
        for w0 in range(0, PER_EPOCH, K):
            window = batches[w0:w0 + K]
            n_tok = torch.tensor(float(sum((lab != IGNORE).sum().item() for _, lab in window)))
            dist.all_reduce(n_tok)
            for idx, lab in window:
                logits = engine(idx)
                tok_sum = F.cross_entropy(logits.reshape(-1, VOCAB), lab.reshape(-1),
                                          ignore_index=IGNORE, reduction="sum")
                engine.backward(tok_sum * WORLD / n_tok, scale_wrt_gas=False)
            engine.step()
            if rank == 0:
                print(f"epoch {epoch} step {engine.global_steps} window {len(window)} "
                      f"tokens {int(n_tok)} loss {tok_sum.item() / max(1, (lab != IGNORE).sum().item()):.4f}", flush=True)

    h = hashlib.sha256()
    full = {}
    for name, p in engine.module.named_parameters():
        full[name] = p.detach().float().clone()
        h.update(full[name].contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if dump:
            torch.save(full, dump)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1] if len(sys.argv) > 1 else None,), nprocs=WORLD, join=True)
