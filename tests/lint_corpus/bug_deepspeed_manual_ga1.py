# corpus: style=deepspeed class=F2
# open-instruct style: the loop accumulates by hand, the config says GA 1
import deepspeed

GRAD_ACCUM = 4
engine, _, loader, _ = deepspeed.initialize(model=model, config="ds_config_ga1.json")
for i, batch in enumerate(loader):
    loss = engine(batch) / GRAD_ACCUM
    engine.backward(loss)
    if (i + 1) % GRAD_ACCUM == 0:
        engine.step()  # expect: AG109
