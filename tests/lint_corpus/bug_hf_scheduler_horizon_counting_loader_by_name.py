# corpus: style=hf class=F4
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments, get_cosine_schedule_with_warmup

BATCH = 8
ACCUM = 4
EPOCHS = 3


def main(model, train_ds):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    sizing = DataLoader(train_ds, batch_size=BATCH)
    n_steps = EPOCHS * len(sizing)
    sched = get_cosine_schedule_with_warmup(opt, 10, n_steps)  # expect: AG124
    args = TrainingArguments("out", per_device_train_batch_size=BATCH,
                             gradient_accumulation_steps=ACCUM, num_train_epochs=EPOCHS,
                             report_to=[])
    Trainer(model=model, args=args, train_dataset=train_ds, optimizers=(opt, sched)).train()
