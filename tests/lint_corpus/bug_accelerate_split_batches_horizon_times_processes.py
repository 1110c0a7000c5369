# corpus: style=accelerate class=F4
# batches split across the processes: the prepared scheduler advances once per optimizer
# step, and the no-Trainer example's `* num_processes` makes the schedule W x long
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from transformers import get_linear_schedule_with_warmup

accelerator = Accelerator(gradient_accumulation_steps=4,
                          dataloader_config=DataLoaderConfiguration(split_batches=True))
max_train_steps = epochs * math.ceil(len(loader) / 4)
scheduler = get_linear_schedule_with_warmup(  # expect: AG360
    optimizer, num_warmup_steps=10 * accelerator.num_processes,
    num_training_steps=max_train_steps * accelerator.num_processes)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
