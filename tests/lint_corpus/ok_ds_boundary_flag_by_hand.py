# corpus: style=deepspeed class=OK
# the accumulation boundary is driven by hand with engine.step() on every micro-batch; the flag
# is true on the gas-th micro-batch of each window and on the pass's last one
import deepspeed

engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for it, (xb, yb) in enumerate(loader):
    boundary = ((it + 1) % gas == 0) or (it == len(loader) - 1)
    engine.set_gradient_accumulation_boundary(boundary)
    loss = engine(xb, yb)
    engine.backward(loss)
    engine.step()
