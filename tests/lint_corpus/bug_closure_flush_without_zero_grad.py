# corpus: style=plain class=F7
# a closure factory returns the micro-step and the update; each epoch's last partial window
# is flushed by the update after the loop, but nothing clears the gradients after the flush:
# the tail's gradient is applied there and again in the next epoch's first window
import torch
import torch.nn.functional as F


def build_step_fns(model, opt, sched):
    def micro_step(x, y, denom):
        loss = F.mse_loss(model(x), y) / denom
        loss.backward()

    def apply_update():
        opt.step()
        sched.step()

    return micro_step, apply_update


def main(model, loader, K, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    micro_step, apply_update = build_step_fns(model, opt, sched)
    n_batches = len(loader)
    n_full, tail = divmod(n_batches, K)
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            micro_step(x, y, K if i < n_full * K else tail)
            if (i + 1) % K == 0:  # expect: AG117
                apply_update()
                opt.zero_grad(set_to_none=True)
        if tail:
            apply_update()
