# corpus: style=hf_trainer class=OK
# the warm-up/stable/decay schedule's decay length is planned from each rank's micro-batches
# per epoch, divided by the accumulation steps (optimizer updates), handed over through
# lr_scheduler_kwargs: the Trainer counts it in optimizer steps, as planned
import math

from transformers import Trainer, TrainingArguments

N_EXAMPLES, PER_DEVICE_BS, GRAD_ACCUM, EPOCHS, WORLD = 960, 4, 3, 2, 2


def plan_schedule():
    batches_per_rank = math.ceil(N_EXAMPLES / (PER_DEVICE_BS * WORLD))
    planned_updates = math.ceil(batches_per_rank / GRAD_ACCUM) * EPOCHS
    return {"num_decay_steps": int(0.25 * planned_updates)}


args = TrainingArguments(output_dir="out", per_device_train_batch_size=PER_DEVICE_BS,
                         gradient_accumulation_steps=GRAD_ACCUM, num_train_epochs=EPOCHS,
                         lr_scheduler_type="warmup_stable_decay",
                         lr_scheduler_kwargs=plan_schedule())
Trainer(model=model, args=args, train_dataset=data).train()
