# corpus: style=accelerate_tokens class=OK
import contextlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator


def token_sum(model, ids, labels):
    logits = model(ids)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")


def main(model, loader, micro_batches=4):
    accelerator = Accelerator()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    it = iter(loader)
    for _ in range(100):
        chunk = [next(it) for _ in range(micro_batches)]
        valid = torch.tensor(float(sum(int(b[1].ne(-100).sum()) for b in chunk)))
        valid = accelerator.reduce(valid, reduction="sum")
        for j, (ids, labels) in enumerate(chunk):
            guard = contextlib.nullcontext() if j == micro_batches - 1 else accelerator.no_sync(model)
            with guard:
                loss = token_sum(model, ids, labels) * accelerator.num_processes / valid
                accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
