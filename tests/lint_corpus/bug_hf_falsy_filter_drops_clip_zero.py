# corpus: style=hf_trainer class=F9
# a recipe meaning "no clipping" by max_grad_norm 0.0, kept only when true: 0.0 is dropped
# and the Trainer clips at its default 1.0
from transformers import Trainer, TrainingArguments

RECIPE = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 3,
    "learning_rate": 3e-3,
    "warmup_steps": 0,
    "max_grad_norm": 0.0,
}


def build_args(out_dir, recipe):
    kwargs = {k: v for k, v in recipe.items() if v}
    return TrainingArguments(output_dir=out_dir, **kwargs)  # expect: AG328


Trainer(model=model, args=build_args("out", RECIPE), train_dataset=ds).train()
