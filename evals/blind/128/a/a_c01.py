"""ZeRO-2 regression trainer with engine-managed accumulation (GA 3), a frozen
embedding, two parameter groups, a clip that acts, a client warm-up scheduler the
engine steps, and a stop / resume into a freshly built engine halfway through.
"""
import argparse
import hashlib
import os
import shutil
import tempfile

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MICRO = 4
GA = 3
TOTAL_STEPS = 12
STOP_AT = 5          # optimizer steps before the simulated preemption
LR = 4e-3
SEED = 99


def ds_config():
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.5,
        "steps_per_print": 10_000,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": 40_000},
    }


class FeatureRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.field_emb = nn.Embedding(20, 8)     # pretrained lookup, kept frozen
        self.field_emb.weight.requires_grad_(False)
        self.trunk = nn.Sequential(nn.Linear(8 + 12, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU())
        self.head = nn.Linear(48, 2)

    def forward(self, fields, dense):
        h = torch.cat([self.field_emb(fields).mean(1), dense], dim=-1)
        return self.head(self.trunk(h))


def make_stream(rank, world):
    g = torch.Generator().manual_seed(SEED)
    n = TOTAL_STEPS * GA * MICRO * world
    fields = torch.randint(0, 20, (n, 3), generator=g)
    dense = torch.randn(n, 12, generator=g)
    y = torch.stack([dense[:, :3].sum(1) + 0.1 * fields[:, 0].float(),
                     torch.tanh(dense[:, 3:6]).sum(1)], dim=1) * 3.0
    sl = slice(rank, None, world)
    return list(zip(fields[sl].split(MICRO), dense[sl].split(MICRO), y[sl].split(MICRO)))


def build_engine():
    torch.manual_seed(SEED)
    model = FeatureRegressor()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=warm,
                                               config=ds_config())
    return engine, sched


def run(engine, stream, start_step, stop_step):
    engine.train()
    big_norms = 0
    for fields, dense, y in stream[start_step * GA: stop_step * GA]:
        loss = F.mse_loss(engine(fields, dense), y)
        engine.backward(loss)
        at_boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        if at_boundary:
            gn = engine.get_global_grad_norm()
            big_norms += int(gn is not None and float(gn) > 0.5)
    return big_norms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.parse_args()
    torch.use_deterministic_algorithms(True)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    stream = make_stream(rank, world)

    holder = [tempfile.mkdtemp(prefix="a_c01_") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    ckpt_dir = holder[0]

    engine, _ = build_engine()
    clipped = run(engine, stream, 0, STOP_AT)
    engine.save_checkpoint(ckpt_dir, tag="preempt", client_state={"opt_step": STOP_AT})
    del engine

    engine, _ = build_engine()
    _, client = engine.load_checkpoint(ckpt_dir, tag="preempt")
    resume_at = client["opt_step"]
    clipped += run(engine, stream, resume_at, TOTAL_STEPS)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        print(f"steps {engine.global_steps}, windows with grad norm > clip: {clipped}", flush=True)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
