# corpus: style=hf class=OK
# The same callback sizing its schedule in optimizer steps: the dataloader's micro-batches
# divided by the accumulation steps.
import math

from transformers import Trainer, TrainerCallback, TrainingArguments


class WarmupCosine(TrainerCallback):
    def __init__(self, warmup_frac=0.1):
        self.warmup_frac = warmup_frac

    def on_train_begin(self, args, state, control, optimizer=None, train_dataloader=None, **kw):
        self.base = [g["lr"] for g in optimizer.param_groups]
        per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
        self.total = per_epoch * int(args.num_train_epochs)
        self.warmup = max(1, int(self.total * self.warmup_frac))

    def on_step_begin(self, args, state, control, optimizer=None, **kw):
        s = state.global_step
        f = (s + 1) / self.warmup if s < self.warmup else \
            0.5 * (1 + math.cos(math.pi * (s - self.warmup) / max(1, self.total - self.warmup)))
        for g, b in zip(optimizer.param_groups, self.base):
            g["lr"] = b * f


def run(model, dataset):
    args = TrainingArguments("out", per_device_train_batch_size=4, gradient_accumulation_steps=4,
                             num_train_epochs=2, lr_scheduler_type="constant")
    Trainer(model=model, args=args, train_dataset=dataset, callbacks=[WarmupCosine()]).train()
