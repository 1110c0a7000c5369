# corpus: style=hf class=OK
# the same callback on on_step_end, which the Trainer calls once per optimizer step
from transformers import Trainer, TrainerCallback, TrainingArguments


class ExtraWarmupStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < args.warmup_steps:
            kwargs["lr_scheduler"].step()


args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=4,
    gradient_accumulation_steps=8,
    warmup_steps=100,
    max_steps=1000,
)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[ExtraWarmupStep()])
trainer.train()
