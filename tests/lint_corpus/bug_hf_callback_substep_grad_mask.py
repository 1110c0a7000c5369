# corpus: style=hf class=F3
# a callback masks the classifier head's gradient for classes absent from the task (and zeroes
# the frozen pooler's by hand) in on_substep_end: neither touches the last micro-batch's gradient
from transformers import Trainer, TrainerCallback, TrainingArguments


class HeadMask(TrainerCallback):
    def __init__(self, keep):
        self.keep = keep

    def on_substep_end(self, args, state, control, **kwargs):
        model = kwargs["model"]
        head = model.classifier.weight
        if head.grad is not None:
            head.grad.data.mul_(self.keep[:, None])  # expect: AG149
        for p in model.pooler.parameters():
            p.grad = None  # expect: AG149


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_steps=200)
trainer = Trainer(model=model, args=args, train_dataset=train_ds, callbacks=[HeadMask(keep)])
trainer.train()
