# corpus: style=hf class=OK
# the ablation switches clipping off with max_grad_norm = 0.0, which the Trainer reads as
# no clipping
from dataclasses import dataclass

from transformers import Trainer, TrainingArguments


@dataclass
class Recipe:
    clip_gradients: bool = False
    max_norm: float = 0.5


r = Recipe()
extra = {"max_grad_norm": r.max_norm if r.clip_gradients else 0.0}
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, **extra)
Trainer(model=model, args=args, train_dataset=train_ds).train()
