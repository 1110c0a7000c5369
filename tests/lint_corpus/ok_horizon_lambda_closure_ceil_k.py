# corpus: style=trainer_class class=OK
import math

import torch


def train(model, train_dl, epochs, grad_accum, warmup_frac=0.05):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total_steps = math.ceil(len(train_dl) / grad_accum) * epochs
    warmup = int(warmup_frac * total_steps)

    def lr_lambda(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    for _ in range(epochs):
        for i, batch in enumerate(train_dl):
            loss = model(**batch).loss / grad_accum  # expect: AG141
            loss.backward()
            if (i + 1) % grad_accum == 0 or i + 1 == len(train_dl):
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
