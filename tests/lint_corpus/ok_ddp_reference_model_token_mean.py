# corpus: style=ddp class=OK
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 32)
        self.head = torch.nn.Linear(32, 64)

    def forward(self, x):
        return self.head(self.emb(x))


def reference(init_sd, batches):
    # the single-process large batch the DDP run must equal
    ref = LM()
    ref.load_state_dict(init_sd)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in batches:
        logits = ref(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / (y != -100).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return ref


def main(batches):
    model = LM()
    init_sd = copy.deepcopy(model.state_dict())
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    world = dist.get_world_size()
    for x, y in batches:
        n = (y != -100).sum().float()
        dist.all_reduce(n)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum") * world / n
        loss.backward()
        opt.step()
        opt.zero_grad()
    return reference(init_sd, batches)
