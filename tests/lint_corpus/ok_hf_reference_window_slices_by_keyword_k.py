# corpus: style=hf class=OK
# an HF Trainer run, then a large-batch reference that takes each window's micro-batches by
# a slice sized with GA_STEPS, the name given as gradient_accumulation_steps: one step per
# window, its zero_grad, clip and scheduler step once per window
import torch
from transformers import Trainer, TrainingArguments

GA_STEPS = 3


def main(model, ref, ds, seen, make_optim, n_steps, loss_of):
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=2,
                             gradient_accumulation_steps=GA_STEPS, max_steps=n_steps)
    Trainer(model=model, args=args, train_dataset=ds).train()
    ropt, rsched = make_optim(ref)
    for w in range(n_steps):
        mbs = seen[w * GA_STEPS:(w + 1) * GA_STEPS]
        ropt.zero_grad()
        loss_of(ref, mbs).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ropt.step()
        rsched.step()
