# corpus: style=deepspeed class=F13
# the accumulation boundary is driven by hand with engine.step() on every micro-batch; the flag
# is true when it % gas == 0 with it from 0, so the first window closes on its first micro-batch
import deepspeed

engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for it, (xb, yb) in enumerate(loader):
    boundary = (it % gas == 0) or (it == len(loader) - 1)
    engine.set_gradient_accumulation_boundary(boundary)  # expect: AG115
    loss = engine(xb, yb)
    engine.backward(loss)
    engine.step()
