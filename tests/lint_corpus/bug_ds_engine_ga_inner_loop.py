# corpus: style=deepspeed class=F14
# The config comes from --deepspeed_config on the command line (not in sight); the loop reads the
# engine's own GA and loops over it around one step(): DeepSpeed gates step() by GA as well.
import argparse

import deepspeed


def main():
    parser = argparse.ArgumentParser()
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    model_engine, _, loader, _ = deepspeed.initialize(args=args, model=build(), training_data=ds)
    n_micro = model_engine.gradient_accumulation_steps()
    it = iter(loader)
    for update in range(args.updates):
        for _ in range(n_micro):
            x, y = next(it)
            loss = criterion(model_engine(x), y)
            model_engine.backward(loss)
        model_engine.step()  # expect: AG110
