# corpus: style=deepspeed class=F14
# the config comes from the command line (`--deepspeed_config`), out of sight; the loop gates
# step() on its own K and never divides the loss, i.e. it expects the engine to scale by 1/GA:
# with GA = K in the config the engine gates a second time
import argparse

import deepspeed
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--grad_accum", type=int, default=8)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_config(config)
    model_engine, optimizer, loader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=dataset
    )
    for step, batch in enumerate(loader):
        outputs = model_engine(input_ids=batch["input_ids"], labels=batch["labels"])
        loss = outputs.loss
        model_engine.backward(loss)
        if (step + 1) % args.grad_accum == 0:
            model_engine.step()  # expect: AG110


if __name__ == "__main__":
    main()
