# corpus: style=hf class=OK
# the same recipe with the horizon counted in optimizer steps (micro-batches over K)
import math

import torch
from transformers import get_cosine_schedule_with_warmup
from trl import SFTConfig, SFTTrainer

RECIPE = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 8, "num_train_epochs": 3}


def train(model, dataset, recipe):
    per_step = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]
    total = math.ceil(len(dataset) / per_step) * recipe["num_train_epochs"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(0.03 * total), total)
    args = SFTConfig(output_dir="out", per_device_train_batch_size=recipe["per_device_train_batch_size"],
                     gradient_accumulation_steps=recipe["gradient_accumulation_steps"],
                     num_train_epochs=recipe["num_train_epochs"])
    SFTTrainer(model=model, args=args, train_dataset=dataset, optimizers=(optimizer, scheduler)).train()


train(model, dataset, RECIPE)
