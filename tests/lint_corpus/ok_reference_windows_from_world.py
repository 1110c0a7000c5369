# corpus: style=ddp class=OK
import math

import torch
import torch.nn.functional as F


def steps_per_epoch(cfg, world):
    per_rank = math.ceil(cfg["n_train"] / world)
    return per_rank // cfg["micro_batch_size"] // cfg["grad_accum"]


def reference(model, X, Y, rank_idx, cfg, world):
    # one step per window on the whole window of every rank: the large batch
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    accum, mb = cfg["grad_accum"], cfg["micro_batch_size"]
    for w in range(steps_per_epoch(cfg, world)):
        idx = []
        for r in range(world):
            idx += rank_idx[r][w * accum * mb:(w + 1) * accum * mb]
        idx = torch.tensor(idx)
        loss = F.mse_loss(model(X[idx]), Y[idx])
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return model
