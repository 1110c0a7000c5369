# corpus: style=deepspeed class=F8
# config from the command line (out of sight); the loop is sized by the engine's GA, so it
# accumulates, and clips values on every micro-batch beside engine.step(): a warning
import argparse

import deepspeed
import torch
import torch.nn.functional as F


def main():
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    engine, _, _, _ = deepspeed.initialize(args=args, model=build(), model_parameters=params)
    for it in range(args.updates * engine.gradient_accumulation_steps()):
        x, y = next_batch()
        engine.backward(F.mse_loss(engine(x), y))
        torch.nn.utils.clip_grad_value_(engine.module.parameters(), 0.5)  # expect: AG105
        engine.step()


if __name__ == "__main__":
    main()
