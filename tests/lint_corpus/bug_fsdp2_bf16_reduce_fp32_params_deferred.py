# corpus: style=fsdp2 class=F12
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def train(policy, rollouts, pg_loss_sum, updates, per_rank):
    world = dist.get_world_size()
    mp_policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)  # expect: AG126
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
