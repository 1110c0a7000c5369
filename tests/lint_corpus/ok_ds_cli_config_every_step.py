# corpus: style=deepspeed class=OK
# the config (out of sight) sets gradient_accumulation_steps; the loop calls step() after every
# backward and lets the engine decide the boundary: the documented DeepSpeed loop
import argparse

import deepspeed
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
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
        model_engine.step()
        if model_engine.is_gradient_accumulation_boundary() and step % 100 == 0:
            print(step, loss.item())


if __name__ == "__main__":
    main()
