"""Sequence classifier on a DeepSpeed ZeRO-2 engine, checkpointed and resumed.

Client AdamW with two parameter groups (no decay on norms/biases), a frozen token
embedding, a client warm-up LambdaLR handed to the engine (it steps it once per optimizer
step), an explicit clip of 0.5, K = 3 from the config. After 6 updates the engine is saved,
thrown away, and a freshly built engine loads the checkpoint and trains to 12 updates.
"""
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, T, CLASSES = 64, 48, 12, 5
MICRO_BS, ACCUM, TOTAL_UPDATES, SAVE_AT = 6, 3, 12, 6
WARMUP, SEED = 4, 99
CKPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "ckpt_b_c01")

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO_BS,
    "gradient_accumulation_steps": ACCUM,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10_000,
}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.emb.weight.requires_grad_(False)  # pretrained lookup table, kept frozen
        self.enc = nn.GRU(D, D, batch_first=True)
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, CLASSES)

    def forward(self, x):
        h, _ = self.enc(self.emb(x))
        return self.out(self.norm(h.mean(1)))


def build_engine():
    torch.manual_seed(SEED)
    model = Classifier()
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=DS_CONFIG)
    return engine


def micro_batch(rank, index):
    g = torch.Generator().manual_seed(SEED * 1000 + 31 * index + rank)
    x = torch.randint(0, VOCAB, (MICRO_BS, T), generator=g)
    y = (x[:, :3].sum(1) % CLASSES)
    return x, y


def train(engine, rank, until):
    micro = engine.global_steps * ACCUM  # every update consumed ACCUM micro-batches per rank
    while engine.global_steps < until:
        x, y = micro_batch(rank, micro)
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        micro += 1


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    if rank == 0 and os.path.isdir(CKPT_DIR):
        shutil.rmtree(CKPT_DIR)
    dist.barrier()

    engine = build_engine()
    train(engine, rank, SAVE_AT)
    engine.save_checkpoint(CKPT_DIR, tag="mid")
    dist.barrier()
    del engine

    engine = build_engine()
    engine.load_checkpoint(CKPT_DIR, tag="mid")
    assert engine.global_steps == SAVE_AT
    train(engine, rank, TOTAL_UPDATES)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
