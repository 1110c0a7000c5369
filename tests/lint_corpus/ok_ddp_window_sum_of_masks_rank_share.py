# corpus: style=ddp class=OK
# the n_live steps all-reduced, then turned into this rank's share (the count over world): DDP's
# average then gives every step of every rank 1 / (all n_live steps)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(iters, chunks):
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    agent = DDP(Policy())
    opt = torch.optim.Adam(agent.parameters(), lr=3e-4)
    for it in range(iters):
        rollouts = [collect(env, agent) for _ in range(chunks)]
        n_live = sum(r.mask.float().sum() for r in rollouts)
        dist.all_reduce(n_live)
        n_live = n_live / world
        opt.zero_grad()
        for j, r in enumerate(rollouts):
            with agent.no_sync() if j < chunks - 1 else torch.enable_grad():
                logp = agent(r.obs).log_prob(r.act)
                loss = -(logp * r.adv * r.mask).sum() / n_live
                loss.backward()
        opt.step()
