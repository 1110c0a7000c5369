# corpus: style=plain class=OK
# K = 2 bf16 additions: below the error bound (K >= 4), a warning only
import torch

ACCUM = 2
model.bfloat16()  # expect: AG120
master = [p.detach().float().requires_grad_() for p in model.parameters()]
optimizer = torch.optim.AdamW(master, lr=1e-4)
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()
            p.grad = None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p in zip(master, model.parameters()):
                p.copy_(m)
