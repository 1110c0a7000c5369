# corpus: style=hf class=F9
# the ablation switches clipping off by leaving max_grad_norm out of the arguments: the
# Trainer keeps its default 1.0 and clips
from dataclasses import dataclass

from transformers import Trainer, TrainingArguments


@dataclass
class Recipe:
    clip_gradients: bool = False
    max_norm: float = 0.5


r = Recipe()
extra = {"max_grad_norm": r.max_norm} if r.clip_gradients else {}  # expect: AG370
args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, **extra)
Trainer(model=model, args=args, train_dataset=train_ds).train()
