"""DeepSpeed ZeRO-1 engine with a frozen embedding, a client optimizer with two parameter
groups, a client warm-up schedule handed to the engine, an explicit clip that acts, and a
save / reload of the engine at an optimizer-step boundary into freshly built objects.
"""
import argparse
import hashlib
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

CKPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ckpt_b_c01")


class Settings(argparse.Namespace):
    micro_bs = 6
    gas = 3
    total_updates = 10
    resume_after = 4
    warmup = 3
    lr = 1e-2
    clip = 0.1
    seed = 99


class Scorer(nn.Module):
    def __init__(self, vocab=40, d=24):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.tok.weight.requires_grad_(False)  # frozen pretrained table
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.score = nn.Linear(d, 1)

    def forward(self, ids):
        h = self.norm(torch.tanh(self.proj(self.tok(ids)))).mean(1)
        return self.score(h).squeeze(-1)


def batch_for(micro_index, rank, world, s):
    g = torch.Generator().manual_seed(s.seed * 7919 + micro_index * world + rank)
    ids = torch.randint(0, 40, (s.micro_bs, 10), generator=g)
    target = (ids.float().mean(1) / 20.0) - 1.0
    return ids, target


def build(s):
    torch.manual_seed(s.seed)
    model = Scorer()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight") and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not (n.endswith("weight") and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda st: min(1.0, (st + 1) / s.warmup))
    cfg = {
        "train_micro_batch_size_per_gpu": s.micro_bs,
        "gradient_accumulation_steps": s.gas,
        "gradient_clipping": s.clip,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, lr_scheduler=sched, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg
    )
    return engine


def run(engine, s, rank, world, first_micro, last_micro):
    for m in range(first_micro, last_micro):
        ids, target = batch_for(m, rank, world, s)
        loss = F.mse_loss(engine(ids), target)
        engine.backward(loss)
        engine.step()
        if rank == 0 and (m + 1) % s.gas == 0:
            print(f"update {engine.global_steps} lr {engine.get_lr()[0]:.5f} loss {loss.item():.4f}", flush=True)


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    s = Settings()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()

    engine = build(s)
    run(engine, s, rank, world, 0, s.resume_after * s.gas)
    engine.save_checkpoint(CKPT_DIR, tag="resume")
    torch.distributed.barrier()
    del engine

    engine = build(s)  # fresh objects, then reload the boundary checkpoint
    engine.load_checkpoint(CKPT_DIR, tag="resume")
    start = engine.global_steps * s.gas
    run(engine, s, rank, world, start, s.total_updates * s.gas)

    out = digest(p for _, p in engine.module.named_parameters())
    torch.distributed.barrier()
    if rank == 0:
        print(f"FINAL_SHA256 {out}", flush=True)
        shutil.rmtree(CKPT_DIR, ignore_errors=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
