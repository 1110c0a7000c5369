"""Classifier on a DeepSpeed ZeRO-3 engine, stopped and resumed into a new engine.

The engine owns accumulation (GA 2), clipping (0.3) and a WarmupLR schedule from the
config. A frozen positional table stays out of the optimizer. Phase 1 trains 5
optimizer steps and saves an engine checkpoint at a window boundary; phase 2 builds a
fresh model and engine, loads the checkpoint and skips global_steps * GA micro-batches.
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist

import deepspeed

CFG = dict(vocab=40, dim=32, seq=10, classes=5, micro_bs=4, ga=2,
           total_steps=10, stop_after=5, lr=2e-3, clip=0.3, seed=3)


class SeqClassifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c["vocab"], c["dim"])
        self.pos = nn.Parameter(torch.randn(c["seq"], c["dim"]) * 0.02, requires_grad=False)
        self.enc = nn.Sequential(nn.Linear(c["dim"], c["dim"]), nn.Tanh(), nn.LayerNorm(c["dim"]))
        self.cls = nn.Linear(c["dim"], c["classes"])

    def forward(self, x, y):
        h = self.enc(self.tok(x) + self.pos)
        return F.cross_entropy(self.cls(h.mean(1)), y)


def ds_config(c):
    return {
        "train_micro_batch_size_per_gpu": c["micro_bs"],
        "gradient_accumulation_steps": c["ga"],
        "gradient_clipping": c["clip"],
        "optimizer": {"type": "AdamW", "params": {"lr": c["lr"], "weight_decay": 0.05, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": c["lr"],
                                                       "warmup_num_steps": 4, "warmup_type": "linear"}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10 ** 9,
    }


def micro_batches(c, rank):
    g = torch.Generator().manual_seed(c["seed"] * 17 + rank)
    n = c["total_steps"] * c["ga"]
    for _ in range(n):
        x = torch.randint(0, c["vocab"], (c["micro_bs"], c["seq"]), generator=g)
        y = (x[:, 0] + x[:, -1]) % c["classes"]
        yield x, y


def build_engine(c):
    torch.manual_seed(c["seed"])
    model = SeqClassifier(c)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config(c))
    return engine


def run(engine, c, rank, start_micro, stop_step):
    for i, (x, y) in enumerate(micro_batches(c, rank)):
        if i < start_micro:
            continue
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        if engine.global_steps >= stop_step:
            break
    return loss.item()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    c = CFG
    box = [tempfile.mkdtemp(prefix="a_c02_") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_dir = box[0]

    engine = build_engine(c)
    run(engine, c, rank, start_micro=0, stop_step=c["stop_after"])
    assert engine.global_steps == c["stop_after"]
    engine.save_checkpoint(ckpt_dir, tag="phase1")
    del engine
    dist.barrier()

    engine = build_engine(c)
    engine.load_checkpoint(ckpt_dir, tag="phase1")
    resumed_at = engine.global_steps * c["ga"]
    last = run(engine, c, rank, start_micro=resumed_at, stop_step=c["total_steps"])
    if rank == 0:
        print(f"resumed at micro-batch {resumed_at}, finished at step {engine.global_steps}, "
              f"loss {last:.4f}, lr {engine.get_lr()[0]:.6f}", flush=True)

    params = [p for _, p in engine.module.named_parameters()]
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
