# corpus: style=nanogpt class=F4
# A warm-up written as a LambdaLR whose function reads the loop's counter, not its step.
import torch
import torch.nn.functional as F

grad_accum = 4
warmup = 50
it = 0


def train(model, loader, opt):
    global it
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: min(1.0, (it + 1) / warmup))  # expect: AG130
    for step, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / grad_accum
        loss.backward()
        it += 1
        if (step + 1) % grad_accum == 0:
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
