# corpus: style=deepspeed class=F14
import argparse

import deepspeed
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--grad_accum", type=int, default=4)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    model = torch.nn.Linear(128, 10)
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=dataset)
    it = iter(loader)
    for step in range(1000):
        for _ in range(args.grad_accum):
            x, y = next(it)
            loss = torch.nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss / args.grad_accum)
        engine.step()  # expect: AG139


if __name__ == "__main__":
    main()
