# corpus: style=hf_trainer class=F8
# a callback meant to log the gradient norm clips it in on_substep_end, which the Trainer calls
# after every micro-batch of a window but the last: the partial sums are clipped
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments


class GradNorm(TrainerCallback):
    def on_substep_end(self, args, state, control, model=None, **kw):
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)  # expect: AG138


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_grad_norm=1.0)
Trainer(model=model, args=args, train_dataset=ds, callbacks=[GradNorm()]).train()
