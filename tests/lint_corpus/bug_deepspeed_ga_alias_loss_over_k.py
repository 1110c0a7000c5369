# corpus: style=deepspeed class=LOSS_SCALE
# the config's GA is a name unpacked from the run's settings, and the loss handed to
# engine.backward is divided by the same setting: DeepSpeed divides by GA once more
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
        loss = torch.nn.functional.cross_entropy(engine(x), y) / opts.accum
        engine.backward(loss)  # expect: AG134
        engine.step()


def loader(n):
    for _ in range(64):
        yield torch.randn(n, 32), torch.randint(0, 4, (n,))
