# corpus: style=accelerate class=F4
# the horizon is computed by a helper from the prepared (per-process) loader's length: one
# process's optimizer steps, while the prepared scheduler advances num_processes times per
# optimizer step
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
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=cfg.warmup,  # expect: AG125
                                                   num_training_steps=max_steps)
    lr_scheduler = accelerator.prepare(lr_scheduler)
    for batch in loader:
        with accelerator.accumulate(policy):
            accelerator.backward(policy(batch).mean())
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
