# corpus: style=accelerate class=OK
# the same helper's count of one process's optimizer steps, multiplied by num_processes
# for the prepared scheduler that advances that many times per optimizer step
import torch
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup


def num_update_steps(cfg, loader_len):
    return loader_len // cfg.gradient_accumulation_steps * cfg.num_train_epochs


def train(cfg, policy, dataset):
    accelerator = Accelerator(gradient_accumulation_steps=cfg.gradient_accumulation_steps)
    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    policy, optimizer, loader = accelerator.prepare(policy, optimizer, loader)
    max_steps = num_update_steps(cfg, len(loader))
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=cfg.warmup * accelerator.num_processes,
        num_training_steps=max_steps * accelerator.num_processes)
    lr_scheduler = accelerator.prepare(lr_scheduler)
    for batch in loader:
        with accelerator.accumulate(policy):
            accelerator.backward(policy(batch).mean())
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
