# corpus: style=hf class=F4
# the callback owns a second scheduler (a cosine restart on the same optimizer) and steps it in
# on_substep_end: it runs per micro-batch, K - 1 times per optimizer step
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class CosineRestarts(TrainerCallback):
    def __init__(self, optimizer, period):
        self.restarts = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=period)

    def on_substep_end(self, args, state, control, **kwargs):
        if state.epoch is not None:
            self.restarts.step()  # expect: AG119


optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_steps=500)
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=train_ds,
    optimizers=(optimizer, None),
    callbacks=[CosineRestarts(optimizer, period=50)],
)
trainer.train()
