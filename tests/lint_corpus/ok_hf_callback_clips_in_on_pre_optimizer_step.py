# corpus: style=hf_trainer class=OK
# a callback clips the encoder's gradient in on_pre_optimizer_step: once per optimizer
# step, after the window's last backward
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class EncoderClip(TrainerCallback):
    def __init__(self, encoder, max_norm):
        self.encoder, self.max_norm = encoder, max_norm

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        torch.nn.utils.clip_grad_norm_(self.encoder.parameters(), self.max_norm)


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_grad_norm=0.0)
trainer = Trainer(model=model, args=args, train_dataset=ds,
                  callbacks=[EncoderClip(model.encoder, 0.5)])
trainer.train()
