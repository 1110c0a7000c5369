# corpus: style=hf_trainer class=F9
# None means "no clipping" for the Trainer, but the None values are filtered out before
# TrainingArguments: max_grad_norm keeps its default 1.0
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
    return TrainingArguments(**kwargs)  # expect: AG328


Trainer(model=model, args=build_args(RunConfig()), train_dataset=ds).train()
