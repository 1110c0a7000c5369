# corpus: style=deepspeed class=OK
"""GA 1 in the config and a hand window under engine.no_sync(): engine.step() at the
window's last micro-batch only (the fixed twin of bug_deepspeed_ga1_hand_window_steps_every_micro),
and the same loop written with one step after the inner loop."""
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
        if not accumulate:
            self.engine.step()

    def fit(self, xs, ys):
        K = self.cfg.accum_steps
        for w in range(len(xs) // K):
            for k in range(K):
                self.micro_step(xs[w * K + k], ys[w * K + k], accumulate=(k < K - 1))

    def fit_inline(self, xs, ys):
        K = self.cfg.accum_steps
        for w in range(len(xs) // K):
            for k in range(K):
                ctx = self.engine.no_sync() if k < K - 1 else nullcontext()
                with ctx:
                    loss = F.mse_loss(self.engine(xs[w * K + k]), ys[w * K + k]) / K
                    self.engine.backward(loss)
            self.engine.step()


def main(model, xs, ys):
    HandAccumTrainer(RunConfig(), model).fit(xs, ys)
