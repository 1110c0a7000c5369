# corpus: style=deepspeed class=OK
# DeepSpeed drives accumulation itself: backward and step on every micro-batch
import argparse

import deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", default="ds_config_ga4.json")
args = parser.parse_args()

model_engine, optimizer, train_loader, lr_scheduler = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=args.deepspeed_config
)
for step, batch in enumerate(train_loader):
    loss = model_engine(batch)
    model_engine.backward(loss)
    model_engine.step()
