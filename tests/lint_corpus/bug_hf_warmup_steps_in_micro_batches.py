# corpus: style=hf class=F4
# warmup_steps computed as a fraction of the dataset over the per-device batch: one device's
# micro-batches, while the Trainer counts warm-up in optimizer steps (K x W micro-batches).
import math
from dataclasses import dataclass

from transformers import Trainer, TrainingArguments


@dataclass
class Config:
    n_train: int = 4096
    per_device_batch: int = 8
    grad_accum: int = 4
    epochs: int = 3
    warmup_frac: float = 0.1

    @property
    def warmup_steps(self) -> int:
        steps_per_epoch = math.ceil(self.n_train / self.per_device_batch)
        return int(self.warmup_frac * steps_per_epoch * self.epochs)


def train(model, dataset, cfg: Config):
    args = TrainingArguments(
        output_dir="out",
        per_device_train_batch_size=cfg.per_device_batch,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        warmup_steps=cfg.warmup_steps,  # expect: AG313
    )
    Trainer(model=model, args=args, train_dataset=dataset).train()
