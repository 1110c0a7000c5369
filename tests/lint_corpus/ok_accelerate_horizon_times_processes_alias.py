# corpus: style=accelerate class=OK
"""Accelerate with a prepared warm-up schedule; the number of processes is kept in a short
name; the
prepared scheduler's horizon is multiplied back by it."""
import math

from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup


def main(model, opt, dl, ga=4):
    acc = Accelerator(gradient_accumulation_steps=ga)
    W = acc.num_processes
    max_train_steps = math.ceil(len(dl) / W / ga)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=5 * W,
                                            num_training_steps=max_train_steps * W)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    for batch in dl:
        with acc.accumulate(model):
            acc.backward(model(**batch).loss)
            opt.step()
            sched.step()
            opt.zero_grad()
