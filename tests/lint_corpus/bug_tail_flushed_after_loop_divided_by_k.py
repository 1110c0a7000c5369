# corpus: style=nanogpt class=F7
import torch

gradient_accumulation_steps = 4
data = [(torch.randn(8, 16), torch.randn(8, 1)) for _ in range(22)]
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    micro = 0
    for xb, yb in data:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss = loss / gradient_accumulation_steps  # expect: AG141
        loss.backward()
        micro += 1
        if micro % gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if micro % gradient_accumulation_steps != 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
