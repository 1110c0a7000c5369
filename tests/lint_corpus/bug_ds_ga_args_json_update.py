# corpus: style=deepspeed class=F14
# The JSON says GA 1, but the script overwrites it with the loop's own K before initialize.
import argparse
import json

import deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--grad_accum", type=int, default=8)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

with open("ds_config_ga1.json") as fh:
    ds_cfg = json.load(fh)
ds_cfg["gradient_accumulation_steps"] = args.grad_accum

engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_cfg)
for epoch in range(args.epochs):
    for step, batch in enumerate(loader):
        engine.backward(engine(batch) / args.grad_accum)
        if (step + 1) % args.grad_accum == 0:
            engine.step()  # expect: AG110
