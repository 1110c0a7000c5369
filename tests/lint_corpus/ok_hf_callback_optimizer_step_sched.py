# corpus: style=hf class=OK
# the second scheduler stepped in on_optimizer_step: once per optimizer step, whatever GA is
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class CosineRestarts(TrainerCallback):
    def __init__(self, optimizer, period):
        self.restarts = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=period)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.restarts.step()

    def on_substep_end(self, args, state, control, **kwargs):
        control.should_log = False


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
