"""Spawned-rank ZeRO-3 language model with a grown vocabulary.

`python a_c02.py` starts its own two ranks.  The engine owns accumulation
(gradient_accumulation_steps = 3) and scales each micro-batch mean by 1/3;
the loop simply calls backward/step for every micro-batch.  The vocabulary is
grown by 6 tokens before the engine is built, the position table is frozen,
and the config carries a warm-up/decay schedule in optimizer steps and a clip
at 0.3 (which acts).
"""
import hashlib, os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.multiprocessing as mp

GA, STEPS, MB, SEQ, D, V0, NEW = 3, 8, 4, 10, 24, 40, 6
PORT = 49051


class LM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, D)
        self.wpe = nn.Embedding(SEQ, D)
        self.body = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.GELU(), nn.Linear(3 * D, D))
        self.out = nn.Linear(D, vocab)

    def forward(self, idx):
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))[None]
        return self.out(h + self.body(h))


def grow(model: LM, extra: int) -> LM:
    v = model.wte.num_embeddings
    wte, out = nn.Embedding(v + extra, D), nn.Linear(D, v + extra)
    with torch.no_grad():
        wte.weight[:v] = model.wte.weight
        wte.weight[v:] = model.wte.weight.mean(0)
        out.weight[:v], out.bias[:v] = model.out.weight, model.out.bias
        out.weight[v:], out.bias[v:] = 0.0, -1.0
    model.wte, model.out = wte, out
    return model


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
                      DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")

    torch.manual_seed(0)
    model = grow(LM(V0), NEW)
    model.wpe.weight.requires_grad_(False)
    cfg = {
        "train_micro_batch_size_per_gpu": MB,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.3,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 4e-3,
                                 "warmup_num_steps": 2, "total_num_steps": STEPS}},
        "steps_per_print": 10_000,
    }
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

    g = torch.Generator().manual_seed(11 + rank)
    V = V0 + NEW
    for _ in range(STEPS * GA):
        x = torch.randint(0, V, (MB, SEQ + 1), generator=g)
        x[:, 1::2] = (x[:, 0::2][:, : x[:, 1::2].shape[1]] + 1) % V
        logits = engine(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            t = p.detach().float().contiguous().clone()
        h.update(t.numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2, join=True)
