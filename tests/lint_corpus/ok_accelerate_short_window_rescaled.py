# corpus: style=accelerate class=OK
import torch
from accelerate import Accelerator

GRAD_ACCUM = 4


def train(model, loader, args):
    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    n = len(loader)
    for epoch in range(args.epochs):
        for i, batch in enumerate(loader):
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                # the epoch's last window may be short: weigh it by its own size
                accelerator.backward(loss * GRAD_ACCUM / min(GRAD_ACCUM, n - i // GRAD_ACCUM * GRAD_ACCUM))
                opt.step()
                opt.zero_grad()
