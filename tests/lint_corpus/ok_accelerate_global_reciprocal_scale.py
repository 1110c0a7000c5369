# corpus: style=accelerate class=OK
import contextlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator


def ce_sum(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")


def train(model, data_iter, max_iters, gradient_accumulation_steps):
    accelerator = Accelerator()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    for it in range(max_iters):
        micro_batches = [next(data_iter) for _ in range(gradient_accumulation_steps)]
        n_tok = torch.tensor(float(sum((y != -100).sum() for _, y in micro_batches)))
        loss_scale = accelerator.num_processes / accelerator.reduce(n_tok, reduction="sum")
        for micro_step, (x, y) in enumerate(micro_batches):
            last = micro_step == gradient_accumulation_steps - 1
            ctx = accelerator.no_sync(model) if not last else contextlib.nullcontext()
            with ctx:
                loss = ce_sum(model, x, y) * loss_scale
                accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
