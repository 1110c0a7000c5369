# corpus: style=hand class=F14
import torch
import torch.nn.functional as F

accum_steps = 8


def run_window(model, batches):
    for xb, yb in batches:
        loss = F.cross_entropy(model(xb), yb) / accum_steps
        loss.backward()


def train(model, opt, get_batch, max_iters):
    for it in range(max_iters):
        window = [get_batch() for _ in range(accum_steps)]
        run_window(model, window)
        if it % accum_steps == 0:  # expect: AG376
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
