# corpus: style=hf_trainer class=OK
# the same recipe filtering only None: 0.0 reaches the Trainer and turns its clip off
from transformers import Trainer, TrainingArguments

RECIPE = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 3,
    "learning_rate": 3e-3,
    "warmup_steps": 0,
    "max_grad_norm": 0.0,
}


def build_args(out_dir, recipe):
    kwargs = {k: v for k, v in recipe.items() if v is not None}
    return TrainingArguments(output_dir=out_dir, **kwargs)


Trainer(model=model, args=build_args("out", RECIPE), train_dataset=ds).train()
