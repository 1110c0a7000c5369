# corpus: style=lightning class=F1
"""Lightning Trainer settings taken from a config dataclass filtered to the Trainer's
signature: the accumulation field is named grad_accum_steps, so it is dropped and the
Trainer keeps K = 1 (blind round 124 c_b03)."""
import inspect
from dataclasses import asdict, dataclass

import pytorch_lightning as pl


@dataclass
class RunConfig:
    max_epochs: int = 3
    grad_accum_steps: int = 3
    gradient_clip_val: float = 1.0


def trainer_kwargs(cfg):
    accepted = inspect.signature(pl.Trainer.__init__).parameters
    return {k: v for k, v in asdict(cfg).items() if k in accepted}  # expect: AG347


cfg = RunConfig()
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", **trainer_kwargs(cfg))
trainer.fit(model, loader)
