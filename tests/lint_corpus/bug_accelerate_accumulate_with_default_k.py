# corpus: style=accelerate class=F1
# the loop runs inside accumulate() but the Accelerator never gets the config's K: with
# gradient_accumulation_steps = 1 accumulate() syncs and the optimizer steps every batch
from dataclasses import dataclass

from accelerate import Accelerator


@dataclass
class TrainConfig:
    lr: float = 1e-4
    gradient_accumulation_steps: int = 8


def train(cfg, model, optimizer, loader):
    accelerator = Accelerator(mixed_precision="no")  # expect: AG322
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
