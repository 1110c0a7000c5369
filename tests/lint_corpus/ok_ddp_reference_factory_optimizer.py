# corpus: style=ddp class=OK
# a DDP run, then rank 0's single-process reference: one backward of the window's whole loss
# (divided by K x W) per step, with an optimizer and scheduler unpacked from a factory
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def build_optim(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    return opt, sched


def run(rank, K, W, stream, steps):
    model = DDP(make_model())
    opt, sched = build_optim(model)
    micro = 0
    for x, y in stream[rank::W]:
        boundary = (micro + 1) % K == 0
        model.require_backward_grad_sync = boundary
        (loss_fn(model(x), y) / K).backward()
        micro += 1
        if boundary:
            opt.step()
            sched.step()
            opt.zero_grad()
    if rank == 0:
        ref_net = make_model()
        ropt, rsched = build_optim(ref_net)
        for step in range(steps):
            window = stream[step * K * W:(step + 1) * K * W]
            loss = sum(loss_fn(ref_net(x), y) for x, y in window) / (K * W)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref_net.parameters(), 1.0)
            ropt.step(); rsched.step(); ropt.zero_grad()
