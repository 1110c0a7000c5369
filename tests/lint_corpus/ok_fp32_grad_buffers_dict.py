# corpus: style=plain class=OK
import torch

ACC_DTYPE = torch.float32
K = 8


def train(model, batches, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    bufs = {n: torch.zeros_like(p, dtype=ACC_DTYPE) for n, p in model.named_parameters()}
    it = iter(batches)
    for _ in range(steps):
        for _ in range(K):
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(model(x), y) / K
            loss.backward()
            for n, p in model.named_parameters():
                bufs[n] += p.grad
                p.grad = None
        for n, p in model.named_parameters():
            p.grad = bufs[n].float()
            bufs[n].zero_()
        opt.step()
