# corpus: style=plain class=F12
# `model = model.to(device, dtype=torch.bfloat16)` before a functional accumulation loop
import torch


def train(model, loader, device, accum_iter=32):
    model = model.to(device, dtype=torch.bfloat16)  # expect: AG120
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x.to(device, dtype=torch.bfloat16)), y) / accum_iter
        loss.backward()
        if (step + 1) % accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
