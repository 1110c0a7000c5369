# corpus: style=hf_trainer class=F8
# an element-wise "spike guard" as a hook on every trainable parameter: autograd runs it on
# each micro-batch's gradient, before the Trainer's accumulation adds it to .grad
from transformers import Trainer, TrainingArguments


def install_grad_guard(model, limit):
    def _clamp(g):
        return g.clamp(-limit, limit)

    for p in model.parameters():
        if p.requires_grad:
            p.register_hook(_clamp)  # expect: AG138


install_grad_guard(model, 0.01)
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_grad_norm=0.0)
Trainer(model=model, args=args, train_dataset=ds).train()
