# corpus: style=accelerate class=LOSS_SCALE
# the same double division written inline, with K read from the command line
import argparse

from accelerate import Accelerator

p = argparse.ArgumentParser()
p.add_argument("--gradient_accumulation_steps", type=int, default=4)
args = p.parse_args()
accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss / args.gradient_accumulation_steps)  # expect: AG121
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
