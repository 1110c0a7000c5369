# corpus: style=deepspeed class=F14
import deepspeed


def train(model, loader, accum_steps=4):
    model, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config_ga4.json")
    for batch_idx, batch in enumerate(loader):
        for micro in batch.chunk(accum_steps):
            loss = model(micro)
            model.backward(loss)
        model.step()  # expect: AG110
