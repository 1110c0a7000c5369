# corpus: style=lightning class=OK
"""Lightning Trainer settings taken from a config dataclass filtered to the Trainer's
signature, with the accumulation field mapped to the Trainer's keyword by hand."""
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
    kwargs = {k: v for k, v in asdict(cfg).items() if k in accepted}
    kwargs["accumulate_grad_batches"] = cfg.grad_accum_steps
    return kwargs


cfg = RunConfig()
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", **trainer_kwargs(cfg))
trainer.fit(model, loader)
