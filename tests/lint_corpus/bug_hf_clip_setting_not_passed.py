# corpus: style=hf class=F9
"""The recipe's clip setting is kept in a dataclass and never given to TrainingArguments:
the Trainer clips at its default max_grad_norm = 1.0."""
from dataclasses import dataclass

from transformers import Trainer, TrainingArguments


@dataclass
class Recipe:
    lr: float = 3e-4
    accum: int = 8
    max_norm: float = 0.0


def run(recipe: Recipe, model, train_ds):
    args = TrainingArguments(  # expect: AG177
        output_dir="out",
        learning_rate=recipe.lr,
        gradient_accumulation_steps=recipe.accum,
        per_device_train_batch_size=4,
    )
    Trainer(model=model, args=args, train_dataset=train_ds).train()
