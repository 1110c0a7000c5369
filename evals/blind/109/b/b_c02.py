"""Denoising autoencoder, DeepSpeed ZeRO-2, interrupted and resumed.

Phase 1 trains 5 optimizer steps and saves an engine checkpoint at a window
boundary; the engine is then thrown away and a brand-new one (new model, new
client optimizer, new client LambdaLR) loads the checkpoint and finishes the
run. Data position is recovered from engine.global_steps. GA = 3 and a clip of
0.25 (it acts), with the first encoder layer frozen.
"""
import hashlib
import os
import shutil
from types import SimpleNamespace

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn

CFG = SimpleNamespace(seed=5, dim=20, hidden=40, micro=5, ga=3, total_steps=10, stop_at=5,
                      lr=2e-3, clip=0.25, ckpt="tmp_scratch/ckpt_c02")


class DAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc0 = nn.Linear(CFG.dim, CFG.hidden)
        self.enc1 = nn.Linear(CFG.hidden, CFG.hidden // 2)
        self.dec = nn.Linear(CFG.hidden // 2, CFG.dim)

    def forward(self, x):
        return self.dec(torch.relu(self.enc1(torch.relu(self.enc0(x)))))


def micro_batch(idx, rank, world):
    g = torch.Generator().manual_seed(10_000 + idx * world + rank)
    clean = torch.randn(CFG.micro, CFG.dim, generator=g).cumsum(-1) / 3
    noisy = clean + 0.3 * torch.randn(CFG.micro, CFG.dim, generator=g)
    return noisy, clean


def build_engine():
    torch.manual_seed(CFG.seed)
    model = DAE()
    model.enc0.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=CFG.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    config = {
        "train_micro_batch_size_per_gpu": CFG.micro,
        "gradient_accumulation_steps": CFG.ga,
        "gradient_clipping": CFG.clip,
        "zero_optimization": {"stage": 2, "overlap_comm": False},
        "steps_per_print": 10 ** 9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=config)
    return engine


def run(engine, until, rank, world):
    start = engine.global_steps * CFG.ga
    for i in range(start, until * CFG.ga):
        x, y = micro_batch(i, rank, world)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    return engine


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0 and os.path.isdir(CFG.ckpt):
        shutil.rmtree(CFG.ckpt)
    dist.barrier()

    engine = run(build_engine(), CFG.stop_at, rank, world)
    engine.save_checkpoint(CFG.ckpt, tag="interrupt")
    del engine
    dist.barrier()

    engine = build_engine()
    engine.load_checkpoint(CFG.ckpt, tag="interrupt")
    engine = run(engine, CFG.total_steps, rank, world)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
