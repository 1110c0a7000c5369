# corpus: style=hf_trainer class=OK
# the recipe spells the key as the TrainingArguments field: it reaches the Trainer
from transformers import HfArgumentParser, Trainer, TrainingArguments

recipe = {
    "output_dir": "out",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 8,
    "learning_rate": 1e-4,
    "wandb_project": "demo",
}


def main(model, data):
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(recipe, allow_extra_keys=True)
    Trainer(model=model, args=args, train_dataset=data).train()
