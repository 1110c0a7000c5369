# corpus: style=deepspeed class=OK
# the same loop handing engine.backward the micro-batch mean: DeepSpeed divides by GA
# itself
import argparse

import deepspeed
import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--micro", type=int, default=2)
    opts = p.parse_args()
    gas, mbs = opts.accum, opts.micro
    model = torch.nn.Linear(32, 4)
    config = {"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas,
              "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    for x, y in loader(mbs):
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()


def loader(n):
    for _ in range(64):
        yield torch.randn(n, 32), torch.randint(0, 4, (n,))
