# corpus: style=plain class=F7
"""Matrices with SGD-Nesterov, the rest with Adam; both step once per window."""
import torch


def train(model, batches, steps, accum):
    mats = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim != 2]
    opt_mat = torch.optim.SGD(mats, lr=0.02, momentum=0.9, nesterov=True)
    opt_rest = torch.optim.Adam(rest, lr=1e-3)
    for s in range(steps):
        for k in range(accum):
            x, y = batches[s][k]
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum
            loss.backward()
        opt_mat.step()
        opt_rest.step()  # expect: AG165
        opt_mat.zero_grad(set_to_none=True)
