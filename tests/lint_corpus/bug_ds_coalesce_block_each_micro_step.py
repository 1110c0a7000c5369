# corpus: style=deepspeed class=F2
# the coalesced reduction entered per micro-batch: every block's flush overwrites the last
import deepspeed
import torch

engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
for step in range(steps):
    for x, y in windows[step]:
        with engine.coalesce_grad_reduction():  # expect: AG303
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
