# corpus: style=fsdp2 class=OK
import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def cli():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reduce-dtype", default="fp32", choices=DTYPES)
    return ap.parse_args()


def train(policy, rollouts, pg_loss_sum, updates, per_rank):
    args = cli()
    world = dist.get_world_size()
    mp_policy = MixedPrecisionPolicy(reduce_dtype=DTYPES[args.reduce_dtype])
    for layer in policy.layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(policy, mp_policy=mp_policy)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    for step in range(updates):
        mine = rollouts[step]
        n_tokens = torch.tensor(float(sum(r["mask"].sum() for r in mine)))
        dist.all_reduce(n_tokens)
        for i, ro in enumerate(mine):
            policy.set_requires_gradient_sync(i == per_rank - 1)
            loss = pg_loss_sum(policy, ro) / n_tokens * world
            loss.backward()
        opt.step()
        opt.zero_grad()
