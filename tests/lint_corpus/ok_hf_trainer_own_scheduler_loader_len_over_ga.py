# corpus: style=hf class=OK
"""The stock Trainer with our own AdamW and linear decay; the schedule's length is read from a
DataLoader over the training set, divided by the accumulation steps."""
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments, get_linear_schedule_with_warmup

BS, GA, EPOCHS = 8, 4, 3


def main(model, ds):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    total = -(-len(DataLoader(ds, batch_size=BS)) // GA) * EPOCHS
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10,
                                                num_training_steps=total)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=BS,
                             gradient_accumulation_steps=GA, num_train_epochs=EPOCHS)
    Trainer(model=model, args=args, train_dataset=ds, optimizers=(optimizer, scheduler)).train()
