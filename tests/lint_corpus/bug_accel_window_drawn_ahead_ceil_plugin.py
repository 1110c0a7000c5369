# corpus: style=accelerate class=F1
# K comes from GradientAccumulationPlugin(num_steps=K); the loop draws ceil(len(loader) / K)
# windows ahead of accumulate(), so its last window always takes the loader's last batch,
# and with sync_with_dataloader on (the plugin's default) every micro-step of that window
# syncs and steps (blind round 52, a_b02)
import math

import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin


def fit(model, opt, loader, K=4):
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K))
    model, opt, loader = acc.prepare(model, opt, loader)
    updates = math.ceil(len(loader) / K)
    it = iter(loader)
    for u in range(updates):
        window = [next(it) for _ in range(min(K, len(loader) - u * K))]
        n_local = sum((b["labels"] != -100).sum() for b in window)
        n_global = acc.gather(n_local.reshape(1)).sum()
        for b in window:
            with acc.accumulate(model):  # expect: AG148
                out = model(b["input_ids"])
                loss = torch.nn.functional.cross_entropy(
                    out.flatten(0, 1), b["labels"].flatten(), reduction="sum") / n_global
                acc.backward(loss * acc.num_processes * K)
                opt.step()
                opt.zero_grad()
