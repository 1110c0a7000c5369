# corpus: style=hf_trainer class=OK
# a callback reads the gradient norm in on_substep_end with an infinite max_norm: nothing is
# clipped
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class GradNorm(TrainerCallback):
    def on_substep_end(self, args, state, control, model=None, **kw):
        torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_grad_norm=1.0)
Trainer(model=model, args=args, train_dataset=ds, callbacks=[GradNorm()]).train()
