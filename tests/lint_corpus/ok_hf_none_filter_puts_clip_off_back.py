# corpus: style=hf_trainer class=OK
# the same filter, with the None that means "no clipping" turned into the Trainer's 0.0
from dataclasses import asdict, dataclass
from typing import Optional

from transformers import Trainer, TrainingArguments


@dataclass
class RunConfig:
    output_dir: str = "out"
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 4
    learning_rate: float = 3e-4
    warmup_steps: Optional[int] = None
    max_grad_norm: Optional[float] = None


def build_args(cfg: RunConfig) -> TrainingArguments:
    kwargs = {k: v for k, v in asdict(cfg).items() if v is not None}
    if cfg.max_grad_norm is None:
        kwargs["max_grad_norm"] = 0.0
    return TrainingArguments(**kwargs)


Trainer(model=model, args=build_args(RunConfig()), train_dataset=ds).train()
