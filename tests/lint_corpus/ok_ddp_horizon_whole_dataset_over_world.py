# corpus: style=ddp class=OK
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import get_linear_schedule_with_warmup


def train(args, model, train_dataset):
    dist.init_process_group("gloo")
    model = DDP(model)
    sampler = DistributedSampler(train_dataset, shuffle=True)
    train_dataloader = DataLoader(train_dataset, batch_size=args.per_device_batch_size, sampler=sampler)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    num_update_steps_per_epoch = math.ceil(
        len(train_dataset) / (args.per_device_batch_size * args.gradient_accumulation_steps * dist.get_world_size()))
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=max_train_steps)
    micro = 0
    for epoch in range(args.num_train_epochs):
        sampler.set_epoch(epoch)
        for x, y in train_dataloader:
            micro += 1
            loss = torch.nn.functional.cross_entropy(model(x), y) / args.gradient_accumulation_steps
            loss.backward()
            if micro % args.gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
