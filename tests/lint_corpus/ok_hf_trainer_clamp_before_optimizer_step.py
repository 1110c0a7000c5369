# corpus: style=hf_trainer class=OK
# the same guard applied once per optimizer step, on the window's summed gradient; a hook
# that only records the gradient's norm clips nothing
from transformers import Trainer, TrainerCallback, TrainingArguments

norms = []


class Guard(TrainerCallback):
    def __init__(self, model, limit):
        self.model, self.limit = model, limit

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.clamp_(-self.limit, self.limit)


for p in model.parameters():
    p.register_hook(lambda g: norms.append(float(g.norm())))
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, max_grad_norm=0.0)
Trainer(model=model, args=args, train_dataset=ds, callbacks=[Guard(model, 0.01)]).train()
