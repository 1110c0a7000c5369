# corpus: style=hf class=F4
# a recipe dict drives TRL's SFTTrainer; the script builds its own cosine schedule and hands it
# over through optimizers=, sizing it in micro-batches: the Trainer steps it once per window of 8
import math

import torch
from transformers import get_cosine_schedule_with_warmup
from trl import SFTConfig, SFTTrainer

RECIPE = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 8, "num_train_epochs": 3}


def train(model, dataset, recipe):
    steps_per_epoch = math.ceil(len(dataset) / recipe["per_device_train_batch_size"])
    total = steps_per_epoch * recipe["num_train_epochs"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(0.03 * total), total)  # expect: AG124
    args = SFTConfig(output_dir="out", per_device_train_batch_size=recipe["per_device_train_batch_size"],
                     gradient_accumulation_steps=recipe["gradient_accumulation_steps"],
                     num_train_epochs=recipe["num_train_epochs"])
    SFTTrainer(model=model, args=args, train_dataset=dataset, optimizers=(optimizer, scheduler)).train()


train(model, dataset, RECIPE)
