# corpus: style=accelerate class=F13
# the resume skips the epoch's completed optimizer steps as if they were batches: the
# loader yields micro-batches, K per optimizer step
from accelerate import Accelerator

K = 4
accelerator = Accelerator(gradient_accumulation_steps=K)
model, opt, loader = accelerator.prepare(model, opt, loader)
steps_per_epoch = len(loader) // K
accelerator.load_state("ckpt")
completed = int(open("ckpt/step.txt").read())
epoch = completed // steps_per_epoch
skip = completed - epoch * steps_per_epoch
for ep in range(epoch, 3):
    batches = accelerator.skip_first_batches(loader, skip) if ep == epoch else loader  # expect: AG331
    for batch in batches:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
