"""ZeRO-1 sentiment-style classifier trained through the DeepSpeed engine.

The engine config is the team's shared ZeRO-1 recipe (kept as JSON so it can be
diffed against the cluster copy); the script only fills in batch sizes.
Loop: the usual DeepSpeed idiom, ``engine.backward(loss); engine.step()`` for
every micro-batch, the engine deciding where the accumulation boundary is.
"""
import argparse
import hashlib
import json

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F

RECIPE = """
{
  "zero_optimization": {"stage": 1, "reduce_bucket_size": 500000000},
  "gradient_clipping": 0.5,
  "managed_gradient_accumulation": false,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.002, "warmup_num_steps": 5, "warmup_type": "linear"}},
  "steps_per_print": 100000,
  "wall_clock_breakdown": false
}
"""


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


class BagClassifier(nn.Module):
    def __init__(self, vocab=200, dim=48, n_cls=3):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, n_cls))

    def forward(self, tok):
        return self.mlp(self.emb(tok))


def shard(rank, n, bs):
    g = torch.Generator().manual_seed(99)
    tok = torch.randint(0, 200, (2, n, bs, 10), generator=g)
    y = (tok[..., :3].sum(-1) % 3)
    return list(zip(tok[rank], y[rank]))


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()

    cfg = json.loads(RECIPE)
    cfg["train_micro_batch_size_per_gpu"] = args.micro_batch
    cfg["gradient_accumulation_steps"] = args.grad_accum
    cfg["train_batch_size"] = args.micro_batch * args.grad_accum * world

    torch.manual_seed(0)
    model = BagClassifier()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)

    data = shard(rank, args.steps * args.grad_accum, args.micro_batch)
    for it, (tok, y) in enumerate(data):
        loss = F.cross_entropy(engine(tok), y)
        engine.backward(loss)
        engine.step()
        if rank == 0 and (it + 1) % (5 * args.grad_accum) == 0:
            print(f"micro {it + 1} updates {engine.global_steps} loss {loss.item():.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
