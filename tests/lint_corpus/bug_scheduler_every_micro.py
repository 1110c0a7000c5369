# corpus: style=plain class=F4
import torch
from transformers import get_linear_schedule_with_warmup


def train(model, loader, args):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 100, 1000)
    model.train()
    for step, batch in enumerate(loader):
        outputs = model(**batch)
        loss = outputs.loss / args.gradient_accumulation_steps
        loss.backward()
        lr_scheduler.step()  # expect: AG103
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
