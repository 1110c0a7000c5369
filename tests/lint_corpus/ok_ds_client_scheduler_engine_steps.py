# corpus: style=deepspeed class=OK
# the engine steps the scheduler it was given; a reference run afterwards steps its own
# scheduler of the same name, another object
import deepspeed
import torch


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config="ds.json")
    for batch in loader:
        engine.backward(engine(batch))
        engine.step()


def reference(model, windows):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    for batch in windows:
        model(batch).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
