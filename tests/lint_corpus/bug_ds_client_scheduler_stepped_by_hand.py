# corpus: style=deepspeed class=F4
# the client scheduler lives in the engine (deepspeed.initialize steps it at each boundary) and
# the loop, ported from plain PyTorch, steps it too at the boundary: the warmup ends twice early
import deepspeed
import torch

opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
engine, optimizer, _, lr_scheduler = deepspeed.initialize(model=model, optimizer=opt,
                                                          lr_scheduler=sched, config="ds.json")
for i, batch in enumerate(loader):
    loss = engine(batch)
    engine.backward(loss)
    engine.step()
    if engine.is_gradient_accumulation_boundary():
        lr_scheduler.step()  # expect: AG153
