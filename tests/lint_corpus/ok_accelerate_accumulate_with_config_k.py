# corpus: style=accelerate class=OK
# the loop runs inside accumulate() and the Accelerator gets the config's K
from dataclasses import dataclass

from accelerate import Accelerator


@dataclass
class TrainConfig:
    lr: float = 1e-4
    gradient_accumulation_steps: int = 8


def train(cfg, model, optimizer, loader):
    accelerator = Accelerator(mixed_precision="no",
                              gradient_accumulation_steps=cfg.gradient_accumulation_steps)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
