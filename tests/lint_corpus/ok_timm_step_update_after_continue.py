# corpus: style=timm class=OK
import torch


def train_one_epoch(epoch, model, loader, optimizer, lr_scheduler, accum_steps=4):
    num_batches_per_epoch = len(loader)
    num_updates = epoch * (num_batches_per_epoch // accum_steps)
    last_idx = num_batches_per_epoch - 1
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        loss = torch.nn.functional.cross_entropy(model(input), target) / accum_steps
        loss.backward()
        if not need_update:
            continue
        optimizer.step()
        optimizer.zero_grad()
        num_updates += 1
        lr_scheduler.step_update(num_updates=num_updates)
