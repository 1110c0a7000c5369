# corpus: style=deepspeed class=F14
# A train_step helper (no loop around it in the file): K backwards, then one engine.step(),
# while the JSON config already has GA 4.
import deepspeed

engine, optimizer, _, _ = deepspeed.initialize(args=cmd_args, model=model, config="ds_config_ga4.json")


def train_step(engine, batch, n_micro=4):
    total = 0.0
    for chunk in batch.chunk(n_micro):
        loss = engine(chunk)
        engine.backward(loss / n_micro)
        total += loss.item()
    engine.step()  # expect: AG110
    return total / n_micro
