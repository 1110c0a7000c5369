# corpus: style=plain class=OK
import torch


def train_one(model, batch, opt, sched, it, accum=4):
    loss = model(batch).mean() / accum
    loss.backward()
    if (it + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
        sched.step()


def run(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for it, batch in enumerate(loader):
        train_one(model, batch, opt, sched, it)
