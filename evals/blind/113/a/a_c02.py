"""Tabular regression on a DeepSpeed ZeRO-3 engine, preempted and resumed.

Phase 1 trains 10 optimizer steps and saves an engine checkpoint at a window boundary;
phase 2 builds a brand-new model and engine, loads the checkpoint (optimizer and
WarmupCosineLR state included) and trains to step 24. The feature embedding table is frozen
(pretrained stand-in), the clip (0.25) acts.
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

K = 3
MICRO_BS = 6
TOTAL_STEPS = 24
PREEMPT_AT = 10
N_CAT, N_NUM, CARD = 4, 6, 10

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO_BS,
    "gradient_accumulation_steps": K,
    "gradient_clipping": 0.25,
    "zero_optimization": {"stage": 3, "overlap_comm": False, "stage3_param_persistence_threshold": 0},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"total_num_steps": TOTAL_STEPS, "warmup_num_steps": 4,
                             "warmup_min_ratio": 0.1, "cos_min_ratio": 0.1, "warmup_type": "linear"}},
    "steps_per_print": 10**6,
}


class TabNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.cat_emb = nn.Embedding(N_CAT * CARD, 8)
        self.num_proj = nn.Linear(N_NUM, 16)
        self.body = nn.Sequential(nn.Linear(N_CAT * 8 + 16, 64), nn.SiLU(), nn.Linear(64, 32), nn.SiLU())
        self.out = nn.Linear(32, 1)

    def forward(self, cat, num):
        offs = torch.arange(N_CAT) * CARD
        e = self.cat_emb(cat + offs).flatten(1)
        return self.out(self.body(torch.cat([e, self.num_proj(num)], dim=-1))).squeeze(-1)


def micro_batch(step, j, rank):
    g = torch.Generator().manual_seed(77 + 1009 * step + 17 * j + 5 * rank)
    cat = torch.randint(0, CARD, (MICRO_BS, N_CAT), generator=g)
    num = torch.randn(MICRO_BS, N_NUM, generator=g)
    y = 3.0 * num[:, 0] - 2.0 * num[:, 1] * num[:, 2] + (cat[:, 0] % 3).float() + 0.1 * torch.randn(MICRO_BS, generator=g)
    return cat, num, y


def build_engine():
    torch.manual_seed(0)
    model = TabNet()
    model.cat_emb.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=DS_CONFIG)
    return engine


def train(engine, start, stop, rank):
    for step in range(start, stop):
        for j in range(K):
            cat, num, y = micro_batch(step, j, rank)
            loss = F.smooth_l1_loss(engine(cat, num), y)
            engine.backward(loss)
            engine.step()
        assert engine.global_steps == step + 1
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--ckpt_dir", default="tmp_scratch/c02_ckpt")
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()

    engine = build_engine()
    train(engine, 0, PREEMPT_AT, rank)
    engine.save_checkpoint(args.ckpt_dir, tag="preempt")
    dist.barrier()
    del engine

    engine = build_engine()
    engine.load_checkpoint(args.ckpt_dir, tag="preempt")
    start = engine.global_steps
    train(engine, start, TOTAL_STEPS, rank)

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params):
        h = hashlib.sha256()
        full = {}
        for name, p in engine.module.named_parameters():
            t = p.detach().float().clone()
            full[name] = t
            h.update(t.contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if args.dump:
            torch.save(full, args.dump)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(args.ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
