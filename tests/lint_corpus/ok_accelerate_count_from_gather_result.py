# corpus: style=accelerate class=OK
# the window's token count is the sum of what accelerator.gather returns (every rank's
# count): the loss divided by it and multiplied by K x W is the window's share
import torch
from accelerate import Accelerator


def train(model, windows, k, loss_sum_fn):
    acc = Accelerator(gradient_accumulation_steps=k)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    for window in windows:
        n_local = sum(int((b["labels"] != -100).sum()) for b in window)
        n_items = acc.gather(torch.tensor([n_local])).sum().item()
        for batch in window:
            with acc.accumulate(model):
                loss = loss_sum_fn(model, batch) / n_items * k * acc.num_processes
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
