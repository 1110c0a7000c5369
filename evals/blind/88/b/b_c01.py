"""DeepSpeed ZeRO-2 engine with gradient accumulation from the config
(train_batch_size = micro * GA * world), an explicit clip that acts, a frozen
embedding, two AdamW parameter groups, and a save/reload into a fresh engine
halfway through."""
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MICRO, GA, STEPS, SAVE_AT = 3, 3, 10, 5
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_b_c01")


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(32, 16)
        self.table.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.Linear(16 + 8, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.head = nn.Linear(64, 1)

    def forward(self, ids, feats):
        return self.head(self.body(torch.cat([self.table(ids), feats], -1))).squeeze(-1)


def build(world):
    torch.manual_seed(3)
    model = Regressor()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight")]
    nodecay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": nodecay, "weight_decay": 0.0}], lr=3e-3)
    cfg = {
        "train_batch_size": MICRO * GA * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 2000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg,
                                           model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def batches(rank):
    g = torch.Generator().manual_seed(40 + rank)
    out = []
    for _ in range(STEPS * GA):
        ids = torch.randint(0, 32, (MICRO,), generator=g)
        feats = torch.randn(MICRO, 8, generator=g)
        y = feats.sum(-1) * 2.0 + torch.sin(ids.float())
        out.append((ids, feats, y))
    return out


def run(engine, data, start, stop, rank):
    for step in range(start, stop):
        for ids, feats, y in data[step * GA:(step + 1) * GA]:
            loss = F.mse_loss(engine(ids, feats), y)
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"step {engine.global_steps} loss {loss.item():.4f}", flush=True)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    data = batches(rank)
    engine = build(world)
    run(engine, data, 0, SAVE_AT, rank)
    engine.save_checkpoint(CKPT, tag="mid")
    dist.barrier()
    del engine
    engine = build(world)
    engine.load_checkpoint(CKPT, tag="mid")
    run(engine, data, engine.global_steps, STEPS, rank)

    fulls = list(engine.module.named_parameters())
    if rank == 0:
        h = hashlib.sha256()
        for _, t in fulls:
            h.update(t.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(CKPT, ignore_errors=True)


if __name__ == "__main__":
    main()
