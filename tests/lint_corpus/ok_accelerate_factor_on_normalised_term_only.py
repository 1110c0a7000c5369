# corpus: style=accelerate class=OK
# the CE is normalised by the window's token count over every rank and multiplied back by
# num_processes x K for DDP's and accelerator.backward's averages; the router z-loss (a
# per-micro-batch mean) is added outside the factor, weighed by those averages as it should
import torch
import torch.distributed as dist
from accelerate import Accelerator


def train(model, windows, z_coef=1e-3, k=4):
    acc = Accelerator(gradient_accumulation_steps=k)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    for window in windows:
        tokens = torch.stack([b["labels"].ne(-100).sum() for b in window]).sum().float()
        dist.all_reduce(tokens)
        for batch in window:
            with acc.accumulate(model):
                logits, z = model(batch["input_ids"])
                ce_sum = torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")
                scale = acc.num_processes * acc.gradient_accumulation_steps
                loss = ce_sum / tokens * scale + z_coef * z
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
