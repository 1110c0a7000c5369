# corpus: style=deepspeed class=OK
# one coalesced block around the window's backwards, then the step
import deepspeed
import torch

engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
for step in range(steps):
    with engine.coalesce_grad_reduction():
        for x, y in windows[step]:
            engine.backward(torch.nn.functional.mse_loss(engine(x), y), scale_wrt_gas=False)
    engine.step()
