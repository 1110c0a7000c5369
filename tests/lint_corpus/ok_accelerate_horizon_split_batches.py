# corpus: style=accelerate class=OK
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup

# split_batches=True: the prepared scheduler steps once per optimizer step
accelerator = Accelerator(gradient_accumulation_steps=4, split_batches=True)
steps = epochs * len(loader) // accelerator.num_processes // 4
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=10, num_training_steps=steps)
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
for epoch in range(epochs):
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(loss_fn(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
