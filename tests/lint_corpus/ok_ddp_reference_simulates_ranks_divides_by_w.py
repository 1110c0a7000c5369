# corpus: style=ddp class=OK
# a DDP run and, in the same file, its one-process large-batch reference: the reference
# loops over the ranks itself and divides by K x W micro-batches (no DDP average there)
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, data, opt, a, world):
    ddp = DDP(model)
    for step in range(a.steps):
        for micro in range(a.accumulation):
            x, y = data(step, micro)
            (torch.nn.functional.mse_loss(ddp(x), y) / a.accumulation).backward()
        opt.step()
        opt.zero_grad()


def reference(ref, data_of, opt, a, world):
    n_micro = a.accumulation * world
    for step in range(a.steps):
        lm_sum, aux_sum = 0.0, 0.0
        for r in range(world):
            for k in range(a.accumulation):
                lm, aux = ref(data_of(step, k, r))
                lm_sum = lm_sum + lm
                aux_sum = aux_sum + aux
        (lm_sum / n_micro + a.router_aux_loss_coef * aux_sum / n_micro).backward()
        opt.step()
        opt.zero_grad()
