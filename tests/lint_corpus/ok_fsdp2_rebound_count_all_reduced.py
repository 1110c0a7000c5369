# corpus: style=fsdp2 class=OK
# The window's token count is rebound to its all-ranks value before the loss is divided by
# it (over W: FSDP2 averages the ranks' gradients).
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def train(model, opt, get_batch, loss_sum, steps, k):
    world = dist.get_world_size()
    fully_shard(model)
    for step in range(steps):
        window = [get_batch(step, m) for m in range(k)]
        n_tokens = sum(int((y != -100).sum()) for _, y in window)
        n_tok = torch.tensor(float(n_tokens))
        dist.all_reduce(n_tok)
        n_tokens = n_tok.item() / world
        for m, (x, y) in enumerate(window):
            model.set_requires_gradient_sync(m == k - 1)
            loss = loss_sum(model, x, y) / n_tokens
            loss.backward()
        opt.step()
        opt.zero_grad()
