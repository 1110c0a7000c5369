# corpus: style=deepspeed class=F1
"""A DeepSpeed engine with gradient_accumulation_steps 1 in a dataclass field, accumulating by
hand under engine.no_sync() but calling engine.step() after every backward: every step is a
boundary (blind round 125 a_b03)."""
from contextlib import nullcontext
from dataclasses import dataclass, field

import deepspeed
import torch.nn.functional as F


@dataclass
class RunConfig:
    accum_steps: int = 3
    ds: dict = field(default_factory=lambda: {
        "train_micro_batch_size_per_gpu": 10,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
    })


class HandAccumTrainer:
    def __init__(self, cfg, model):
        self.cfg = cfg
        self.engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config=cfg.ds)

    def micro_step(self, x, y, accumulate):
        ctx = self.engine.no_sync() if accumulate else nullcontext()
        with ctx:
            loss = F.mse_loss(self.engine(x), y) / self.cfg.accum_steps
            self.engine.backward(loss)
        self.engine.step()  # expect: AG349

    def fit(self, xs, ys):
        K = self.cfg.accum_steps
        for w in range(len(xs) // K):
            for k in range(K):
                self.micro_step(xs[w * K + k], ys[w * K + k], accumulate=(k < K - 1))


def main(model, xs, ys):
    HandAccumTrainer(RunConfig(), model).fit(xs, ys)
