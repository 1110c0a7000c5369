"""DeepSpeed ZeRO-3 trainer for a tiny bag-of-embeddings classifier.

The engine owns accumulation (GA 3 in the config, engine.step() every micro-batch),
clips at 0.3, and the pretrained-style embedding table is frozen. Two parameter
groups: no weight decay on biases and norms.
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, N_CLS, SEQ = 50, 32, 4, 6
MICRO, GA, STEPS = 4, 3, 10


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, N_CLS)

    def forward(self, ids):
        h = self.embed(ids).mean(1)
        h = self.norm(torch.tanh(self.proj(h)))
        return self.head(h)


def param_groups(model, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--dump", default=None)
    args, _ = ap.parse_known_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = BagClassifier()
    model.embed.weight.requires_grad_(False)
    optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=5e-3)
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.3,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    g = torch.Generator().manual_seed(1)
    n = STEPS * GA * MICRO * world
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    labels = (ids % N_CLS).sum(1) % N_CLS

    engine.train()
    for i in range(STEPS * GA):
        start = (i * world + rank) * MICRO
        x, y = ids[start:start + MICRO], labels[start:start + MICRO]
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()

    h = hashlib.sha256()
    flat = []
    for _, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            t = p.detach().to(torch.float32).contiguous().clone()
        h.update(t.numpy().tobytes())
        flat.append(t.reshape(-1))
    if rank == 0:
        if args.dump:
            torch.save(torch.cat(flat), args.dump)
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
