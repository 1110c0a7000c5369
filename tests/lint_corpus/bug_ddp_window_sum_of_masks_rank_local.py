# corpus: style=ddp class=F6
# each rank normalises by the live steps of its own window, never all-reduced
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
agent = DDP(Policy())
opt = torch.optim.Adam(agent.parameters(), lr=3e-4)
for it in range(iters):
    rollouts = [collect(env, agent) for _ in range(chunks)]
    live = sum(r.mask.float().sum() for r in rollouts)
    opt.zero_grad()
    for j, r in enumerate(rollouts):
        with agent.no_sync() if j < chunks - 1 else torch.enable_grad():
            logp = agent(r.obs).log_prob(r.act)
            obj = -(logp * r.adv * r.mask).sum() / live  # expect: AG113
            obj.backward()
    opt.step()
