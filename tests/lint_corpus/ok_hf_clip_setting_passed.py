# corpus: style=hf class=OK
"""The recipe's clip setting is given to TrainingArguments (0: no clipping)."""
from dataclasses import dataclass

from transformers import Trainer, TrainingArguments


@dataclass
class Recipe:
    lr: float = 3e-4
    accum: int = 8
    max_norm: float = 0.0


def run(recipe: Recipe, model, train_ds):
    args = TrainingArguments(
        output_dir="out",
        learning_rate=recipe.lr,
        gradient_accumulation_steps=recipe.accum,
        per_device_train_batch_size=4,
        max_grad_norm=recipe.max_norm,
    )
    Trainer(model=model, args=args, train_dataset=train_ds).train()
