# corpus: style=accelerate class=OK
# batches not split: the prepared scheduler advances num_processes times per optimizer
# step, so the horizon counts num_processes scheduler steps per update
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from transformers import get_linear_schedule_with_warmup

accelerator = Accelerator(gradient_accumulation_steps=4,
                          dataloader_config=DataLoaderConfiguration(split_batches=False))
max_train_steps = epochs * math.ceil(len(loader) / 4)
scheduler = get_linear_schedule_with_warmup(
    optimizer, num_warmup_steps=10 * accelerator.num_processes,
    num_training_steps=max_train_steps * accelerator.num_processes)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
