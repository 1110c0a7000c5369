"""ZeRO-1 with DeepSpeed's own accumulation switched off (GA 1 in the config):
the loop accumulates K micro-batches itself, keeping DeepSpeed from reducing
the first K-1 backwards with `engine.no_sync()`, and calls `engine.step()`
once per window.  Two AdamW groups (no decay on norms and biases), clip 0.8.
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

CFG = dict(d_in=24, d_hidden=64, n_cls=6, micro_bs=5, accum=3, windows=8, lr=2e-3, clip=0.8, seed=3)

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": CFG["micro_bs"],
    "gradient_accumulation_steps": 1,
    "gradient_clipping": CFG["clip"],
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 200000, "allgather_bucket_size": 200000},
    "steps_per_print": 10**6,
}


class Classifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.inp = nn.Linear(c["d_in"], c["d_hidden"])
        self.norm = nn.LayerNorm(c["d_hidden"])
        self.hidden = nn.Linear(c["d_hidden"], c["d_hidden"])
        self.cls = nn.Linear(c["d_hidden"], c["n_cls"])

    def forward(self, x):
        h = F.gelu(self.norm(self.inp(x)))
        return self.cls(h + F.gelu(self.hidden(h)))


def build_model():
    torch.manual_seed(CFG["seed"])
    return Classifier(CFG)


def param_groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if n.endswith("bias") or n.startswith("norm") else decay).append(p)
    return [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]


def rank_batches(rank):
    g = torch.Generator().manual_seed(77 + rank)
    n = CFG["windows"] * CFG["accum"]
    x = torch.randn(n, CFG["micro_bs"], CFG["d_in"], generator=g)
    y = (x[..., :6].argmax(-1) + (x[..., 6] > 0).long()) % CFG["n_cls"]
    return list(zip(x, y))


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def report(named_params):
    h = hashlib.sha256()
    for _, p in named_params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.use_deterministic_algorithms(True)
    model = build_model()
    opt = torch.optim.AdamW(param_groups(model), lr=CFG["lr"])
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=DS_CONFIG)

    K = CFG["accum"]
    batches = rank_batches(rank)
    for w in range(CFG["windows"]):
        window = batches[w * K:(w + 1) * K]
        for x, y in window[:-1]:
            with engine.no_sync():
                engine.backward(loss_fn(engine, x, y) / K)
        x, y = window[-1]
        engine.backward(loss_fn(engine, x, y) / K)
        engine.step()

    if rank == 0:
        report(engine.module.named_parameters())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
