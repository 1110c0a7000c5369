# corpus: style=nanogpt class=F6
# the same script, but each rank divides its window sum by its own token count, never
# all-reduced, and DDP averages the ranks: ranks with fewer tokens weigh more
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, idx, targets):
        logits = self.out(self.tok(idx))
        summed = torch.nn.functional.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1, reduction="sum")
        return logits, summed


def run():
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    accum = 4
    data = torch.load(os.environ["DATA"])
    net = DDP(TinyLM())
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    for step in range(10):
        chunk = data[step]
        tokens = torch.tensor(float(sum(int((y != -1).sum()) for _, y in chunk[rank])))
        for micro in range(accum):
            x, y = chunk[rank][micro]
            net.require_backward_grad_sync = micro == accum - 1
            out, summed = net(x, y)
            (summed / tokens).backward()  # expect: AG113
        opt.step()
        opt.zero_grad(set_to_none=True)
    if rank == 0:
        ref = TinyLM()
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-4)
        for step in range(10):
            x = torch.cat([mb[0] for r in data[step] for mb in r])
            y = torch.cat([mb[1] for r in data[step] for mb in r])
            out, summed = ref(x, y)
            loss = summed / (y != -1).sum()
            loss.backward()
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
