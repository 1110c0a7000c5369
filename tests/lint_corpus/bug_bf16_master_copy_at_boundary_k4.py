# corpus: style=plain class=F12
# K = 4 bf16 additions behind fp32 master weights: the window is summed in bf16 (an error from K = 4)
import torch

ACCUM = 4
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
