"""ZeRO-3 fine-tuning of a small transformer encoder with a frozen token embedding,
preempted half-way and resumed from a DeepSpeed checkpoint into a fresh engine.

DeepSpeed owns the accumulation (gradient_accumulation_steps = 4), the clipping
and the warm-up schedule; the loop calls engine.backward / engine.step on every
micro-batch and resumes the data stream from engine.global_steps.
"""
import argparse
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_DIR = os.path.join(HERE, "_ckpt_b_c01")


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro_bs", type=int, default=4)
    p.add_argument("--gas", type=int, default=4)
    p.add_argument("--total_steps", type=int, default=12)
    p.add_argument("--preempt_at", type=int, default=6)
    p.add_argument("--seed", type=int, default=5)
    return p.parse_args()


class Encoder(nn.Module):
    def __init__(self, vocab=64, dim=32, n_cls=4, seq=12):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.cls = nn.Linear(dim, n_cls)

    def forward(self, ids):
        h = self.enc(self.tok(ids) + self.pos)
        return self.cls(h.mean(1))


def ds_config(a, world):
    return {
        "train_micro_batch_size_per_gpu": a.micro_bs,
        "gradient_accumulation_steps": a.gas,
        "train_batch_size": a.micro_bs * a.gas * world,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 5,
                       "warmup_type": "linear"},
        },
        "steps_per_print": 10_000,
    }


def build_engine(a, world):
    torch.manual_seed(a.seed)
    model = Encoder()
    model.tok.weight.requires_grad_(False)  # pretrained table, kept frozen
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           model_parameters=params, config=ds_config(a, world))
    return engine


def micro_batch(a, rank, world, global_micro):
    g = torch.Generator().manual_seed(a.seed * 1000 + global_micro * world + rank)
    ids = torch.randint(0, 64, (a.micro_bs, 12), generator=g)
    y = (ids[:, 0] + ids[:, 5]) % 4
    return ids, y


def run(engine, a, rank, world, until):
    start_micro = engine.global_steps * a.gas
    for m in range(start_micro, until * a.gas):
        ids, y = micro_batch(a, rank, world, m)
        loss = F.cross_entropy(engine(ids), y)
        engine.backward(loss)
        engine.step()
    if rank == 0:
        print(f"global_steps {engine.global_steps} loss {loss.item():.4f} "
              f"lr {engine.get_lr()[0]:.2e}", flush=True)


def main():
    a = parse()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0 and os.path.isdir(CKPT_DIR):
        shutil.rmtree(CKPT_DIR)
    dist.barrier()

    engine = build_engine(a, world)
    run(engine, a, rank, world, a.preempt_at)
    engine.save_checkpoint(CKPT_DIR, tag="preempt")
    dist.barrier()
    del engine

    # "new job": fresh objects, state from disk
    engine = build_engine(a, world)
    engine.load_checkpoint(CKPT_DIR, tag="preempt")
    run(engine, a, rank, world, a.total_steps)

    named = list(engine.module.named_parameters())
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        for _, p in named:
            h.update(p.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(CKPT_DIR, ignore_errors=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
