"""DeepSpeed ZeRO-3 trainer with a frozen stem, two AdamW groups, an engine
warm-up schedule from the config, an explicit clip, and a checkpoint taken at
an optimizer-step boundary that is reloaded into freshly built objects."""
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

WORLD = int(os.environ.get("WORLD_SIZE", "2"))
MICRO = 4
ACCUM = 3
CFG = {
    "train_batch_size": MICRO * ACCUM * WORLD,          # -> GA = 3
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_clipping": 0.5,
    "zero_allow_untested_optimizer": True,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                          "overlap_comm": False, "contiguous_gradients": False},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3,
                             "warmup_num_steps": 4, "warmup_type": "linear"}},
    "steps_per_print": 10000,
}
TOTAL_STEPS = 10
SAVE_AT = 5
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ckpt_b_c01")


class TinyEncoder(nn.Module):
    def __init__(self, d_in=20, d=48, n_out=6):
        super().__init__()
        self.stem = nn.Linear(d_in, d)            # frozen
        self.norm = nn.LayerNorm(d)
        self.body = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.head = nn.Linear(d, n_out)

    def forward(self, x):
        h = self.norm(torch.tanh(self.stem(x)))
        return self.head(h + self.body(h))


def build(seed=3):
    torch.manual_seed(seed)
    model = TinyEncoder()
    model.stem.requires_grad_(False)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim == 1 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=CFG)
    return engine


def data(rank):
    g = torch.Generator().manual_seed(99)
    n = TOTAL_STEPS * ACCUM * MICRO * WORLD
    x = torch.randn(n, 20, generator=g) * 2.0
    y = (x[:, :6] * x[:, 6:12]).argmax(-1)
    x, y = x[rank::WORLD], y[rank::WORLD]
    return list(zip(x.split(MICRO), y.split(MICRO)))


def run_steps(engine, batches, until):
    while engine.global_steps < until:
        start = engine.global_steps * ACCUM
        for x, y in batches[start:start + ACCUM]:
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
    return loss


def final_sha(engine):
    params = [p for _, p in engine.module.named_parameters()]
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for _, p in engine.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    batches = data(rank)

    engine = build()
    loss = run_steps(engine, batches, SAVE_AT)
    if rank == 0:
        print(f"step {engine.global_steps} loss {loss.item():.4f} lr {engine.get_lr()}", flush=True)
    engine.save_checkpoint(CKPT, tag="mid")
    dist.barrier()
    del engine

    engine = build(seed=12345)                    # different init: must be overwritten
    engine.load_checkpoint(CKPT, tag="mid")
    loss = run_steps(engine, batches, TOTAL_STEPS)
    if rank == 0:
        print(f"step {engine.global_steps} loss {loss.item():.4f} lr {engine.get_lr()}", flush=True)

    sha = final_sha(engine)
    dist.barrier()
    if rank == 0:
        print(f"FINAL_SHA256 {sha}", flush=True)
        shutil.rmtree(CKPT, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
