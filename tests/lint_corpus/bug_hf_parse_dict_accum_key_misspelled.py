# corpus: style=hf_trainer class=F1
# a recipe dict turned into TrainingArguments with allow_extra_keys=True: the accumulation
# key is spelled `grad_accum_steps`, dropped silently, so the Trainer does not accumulate
from transformers import HfArgumentParser, Trainer, TrainingArguments

recipe = {
    "output_dir": "out",
    "per_device_train_batch_size": 8,
    "grad_accum_steps": 8,  # expect: AG191
    "learning_rate": 1e-4,
    "wandb_project": "demo",
}


def main(model, data):
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(recipe, allow_extra_keys=True)
    Trainer(model=model, args=args, train_dataset=data).train()
