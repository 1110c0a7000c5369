# corpus: style=nanogpt class=OK
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

gradient_accumulation_steps = 4
batch_size = 8
max_iters = 10


def get_batch(rows, it, micro_step, rank, world):
    start = ((it * gradient_accumulation_steps + micro_step) * world + rank) * batch_size
    chunk = rows[start:start + batch_size]
    return chunk[:, :-1], chunk[:, 1:]


def main(model, rows):
    rank, world = dist.get_rank(), dist.get_world_size()
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = rows[: max_iters * gradient_accumulation_steps * world * batch_size]
    for it in range(max_iters):
        micro = [get_batch(data, it, m, rank, world) for m in range(gradient_accumulation_steps)]
        n_tokens = torch.tensor(float(sum((y != -100).sum() for _, y in micro)))
        dist.all_reduce(n_tokens)
        for x, y in micro:
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum") * world / n_tokens
            loss.backward()
        opt.step()
        opt.zero_grad()
