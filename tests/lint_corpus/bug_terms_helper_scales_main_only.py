# corpus: style=plain class=LOSS_SCALE
# a helper divides the CE by the accumulation count; the z-loss is added after it, undivided:
# that term weighs K times its coefficient
import torch
import torch.nn.functional as F


def scale_for_accumulation(t, n):
    return t / n


def lm_losses(model, x):
    logits = model(x[:, :-1])
    ce = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return ce, z


def train(model, opt, loader, args):
    for it, (x,) in enumerate(loader):
        ce, z = lm_losses(model, x)
        loss = scale_for_accumulation(ce, args.accum_iters)
        loss = loss + args.z_loss * z  # expect: AG127
        loss.backward()
        if (it + 1) % args.accum_iters == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
