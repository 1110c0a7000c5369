"""Regression model on DeepSpeed ZeRO-2 (config written to a JSON file), GA 3, a frozen
input embedding, two AdamW groups, a client warm-up schedule owned by the engine, clipping
at 0.5. Training is interrupted after 6 updates, checkpointed, and resumed into a freshly
built engine for 6 more."""
import argparse
import hashlib
import json
import os
import shutil
import tempfile

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MICRO_BS = 6
GA = 3
STEPS_FIRST = 6
STEPS_TOTAL = 12
SEED = 99


class FeatureRegressor(nn.Module):
    def __init__(self, n_feat=40, d=24):
        super().__init__()
        self.feat_emb = nn.Embedding(n_feat, d)
        self.feat_emb.weight.requires_grad_(False)  # pre-trained, frozen
        self.body = nn.Sequential(nn.Linear(d, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh())
        self.out = nn.Linear(48, 1)

    def forward(self, idx, w):
        e = (self.feat_emb(idx) * w.unsqueeze(-1)).sum(1)
        return self.out(self.body(e)).squeeze(-1)


def write_config(path):
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BS,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 2000, "allgather_bucket_size": 2000},
        "steps_per_print": 100000,
    }
    with open(path, "w") as f:
        json.dump(cfg, f)


def build(cfg_path):
    torch.manual_seed(SEED)
    model = FeatureRegressor()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}], lr=4e-3)
    warm = 4
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg_path)
    return engine, sched


def data(rank):
    g = torch.Generator().manual_seed(SEED + rank)
    n = STEPS_TOTAL * GA * MICRO_BS
    idx = torch.randint(0, 40, (n, 5), generator=g)
    w = torch.rand(n, 5, generator=g)
    y = torch.sin(idx.float().mean(1) / 6.0) + (w.sum(1) - 2.5)
    return idx, w, y


def run(engine, batches, first_micro, last_micro):
    idx, w, y = batches
    for m in range(first_micro, last_micro):
        sl = slice(m * MICRO_BS, (m + 1) * MICRO_BS)
        loss = F.mse_loss(engine(idx[sl], w[sl]), y[sl])
        engine.backward(loss)
        engine.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    box = [tempfile.mkdtemp(prefix="b_c01_") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    workdir = box[0]
    cfg_path = os.path.join(workdir, "ds_config.json")
    if rank == 0:
        write_config(cfg_path)
    dist.barrier()

    batches = data(rank)
    engine, _ = build(cfg_path)
    run(engine, batches, 0, STEPS_FIRST * GA)
    assert engine.global_steps == STEPS_FIRST
    engine.save_checkpoint(os.path.join(workdir, "ckpt"), tag="interrupt", client_state={"micro": STEPS_FIRST * GA})
    del engine

    engine, sched = build(cfg_path)
    _, client = engine.load_checkpoint(os.path.join(workdir, "ckpt"), tag="interrupt")
    run(engine, batches, client["micro"], STEPS_TOTAL * GA)
    assert engine.global_steps == STEPS_TOTAL

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        print(f"lr {sched.get_last_lr()}")
        print(f"FINAL_SHA256 {h.hexdigest()}")
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
