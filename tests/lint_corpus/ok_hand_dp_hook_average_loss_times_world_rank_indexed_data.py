# corpus: style=hand class=OK
"""Data parallelism by hand: a post-accumulate hook averages each gradient over the ranks as
soon as it is ready; the loss over the window's all-ranks token count is multiplied by the
world size to undo that average. The rank only picks this rank's data."""
import torch
import torch.distributed as dist

WORLD = 2


def train(model, ids, labels, rank, steps, accum, opt):
    def average(p):
        dist.all_reduce(p.grad)
        p.grad.div_(WORLD)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(average)
    for s in range(steps):
        n_glob = (labels[s] != -100).sum().float()
        dist.all_reduce(n_glob)
        for k in range(accum):
            logits = model(ids[s, k, rank])
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels[s, k, rank].flatten(), reduction="sum") * WORLD / n_glob
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
