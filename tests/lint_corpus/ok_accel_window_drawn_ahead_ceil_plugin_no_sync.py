# corpus: style=accelerate class=OK
# the same windows drawn ahead of accumulate() with sync_with_dataloader=False: the last
# window syncs at its K-th micro-step only (blind round 52, a_b02_fixed)
import math

import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


def fit(model, opt, loader, K=4):
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False))
    model, opt, loader = acc.prepare(model, opt, loader)
    updates = math.ceil(len(loader) / K)
    it = iter(loader)
    for u in range(updates):
        window = [next(it) for _ in range(min(K, len(loader) - u * K))]
        n_local = sum((b["labels"] != -100).sum() for b in window)
        n_global = acc.gather(n_local.reshape(1)).sum()
        for b in window:
            with acc.accumulate(model):
                out = model(b["input_ids"])
                loss = torch.nn.functional.cross_entropy(
                    out.flatten(0, 1), b["labels"].flatten(), reduction="sum") / n_global
                acc.backward(loss * acc.num_processes * K)
                opt.step()
                opt.zero_grad()
