# corpus: style=deepspeed class=F2
import argparse

import deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", default="ds_config_ga1.json")
args = parser.parse_args()
engine, opt, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
accum = 8
for step, batch in enumerate(loader):
    engine.backward(engine(batch) / accum)
    if (step + 1) % accum == 0:
        engine.step()  # expect: AG109
