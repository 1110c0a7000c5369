"""ZeRO-2 fine-tune with a mid-run checkpoint reloaded into a fresh engine.

The micro-step keeps the torch idiom (zero_grad / backward / step); the
engine owns accumulation, gradient pre-division and clipping (set explicitly
below).
"""
import hashlib
import json
import os
import shutil

import torch
import torch.nn as nn
import torch.distributed as dist
import deepspeed

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_DIR = os.path.join(HERE, "tmp_scratch", "b_c01_ckpt")

DS_CONFIG_TEXT = """
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 3,
  "gradient_clipping": 0.5,
  "prescale_gradients": false,
  "gradient_predivide_factor": 2.0,
  "zero_optimization": {
    "stage": 2,
    "overlap_comm": false,
    "reduce_scatter": false,
    "contiguous_gradients": true,
    "reduce_bucket_size": 2000
  },
  "zero_allow_untested_optimizer": true,
  "zero_force_ds_cpu_optimizer": false,
  "steps_per_print": 100000
}
"""
TOTAL_STEPS = 10
RESUME_AT = 4
SEED = 2024


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.mlp = nn.Sequential(nn.Linear(16 + 8, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.out = nn.Linear(64, 1)

    def forward(self, cat, num):
        return self.out(self.mlp(torch.cat([self.emb(cat), num], -1))).squeeze(-1)


def micro_batch(rank, idx):
    g = torch.Generator().manual_seed(SEED + 1000 * rank + idx)
    cat = torch.randint(0, 32, (4,), generator=g)
    num = torch.randn(4, 8, generator=g)
    y = num[:, 0] * 2.0 - num[:, 1] + (cat.float() / 16.0) + 0.05 * torch.randn(4, generator=g)
    return cat, num, y


def build_engine(cfg):
    torch.manual_seed(SEED)
    model = Regressor()
    model.emb.weight.requires_grad_(False)  # pretrained lookup table stays fixed
    groups = [
        {"params": [p for n, p in model.named_parameters() if p.requires_grad and p.ndim > 1], "weight_decay": 0.05},
        {"params": [p for n, p in model.named_parameters() if p.requires_grad and p.ndim <= 1], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=4e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg)
    return engine


def run(engine, start_step, stop_step, rank):
    K = engine.gradient_accumulation_steps()
    loss_fn = nn.SmoothL1Loss()
    for step in range(start_step, stop_step):
        for k in range(K):
            cat, num, y = micro_batch(rank, step * K + k)
            engine.zero_grad()
            loss = loss_fn(engine(cat, num), y)
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"step {engine.global_steps} loss {loss.item():.4f} lr {engine.get_lr()[0]:.5f}", flush=True)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()
    cfg = json.loads(DS_CONFIG_TEXT)

    engine = build_engine(cfg)
    run(engine, 0, RESUME_AT, rank)
    if rank == 0 and os.path.isdir(CKPT_DIR):
        shutil.rmtree(CKPT_DIR)
    dist.barrier()
    engine.save_checkpoint(CKPT_DIR, tag="mid")
    dist.barrier()
    del engine

    engine = build_engine(cfg)
    engine.load_checkpoint(CKPT_DIR, tag="mid")
    run(engine, engine.global_steps, TOTAL_STEPS, rank)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
