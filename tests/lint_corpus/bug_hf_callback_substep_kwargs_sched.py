# corpus: style=hf class=F4
# a TrainerCallback advances the schedule in on_substep_end, which the Trainer calls after every
# micro-batch of a window but the last: with GA = 8 the warmup ends 8 times too early
from transformers import Trainer, TrainerCallback, TrainingArguments


class PerBatchWarmup(TrainerCallback):
    def on_substep_end(self, args, state, control, **kwargs):
        kwargs["lr_scheduler"].step()  # expect: AG119


args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=8,
    warmup_steps=100,
    max_steps=1000,
)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[PerBatchWarmup()])
trainer.train()
