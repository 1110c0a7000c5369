# corpus: style=rl_grpo class=OK
# GRPO: one masked mean per completion, their mean over the micro-batch's completions
# (as many in every micro-batch) divided by K: the large batch's mean over completions
from contextlib import nullcontext

import torch


def per_sequence(logp, old_logp, adv, mask):
    ratio = torch.exp(logp - old_logp)
    per_tok = -torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    return (per_tok * mask).sum(1) / mask.sum(1)


def update(model, window, opt, grad_accum):
    for k, b in enumerate(window):
        with model.no_sync() if k < grad_accum - 1 else nullcontext():
            logp = model(b["seqs"])
            loss = per_sequence(logp, b["old"], b["adv"], b["mask"]).mean() / grad_accum
            loss.backward()
    opt.step()
    opt.zero_grad()
