# corpus: style=plain class=OK
import torch

K = 4
model = torch.nn.Linear(6, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
X, Y = torch.randn(96, 6), torch.randn(96, 2)
micro = 0
if resuming:
    micro = checkpoint["micro"]  # a restored counter: its start is not in sight
while micro < 12:
    i = micro * 8
    loss = torch.nn.functional.mse_loss(model(X[i:i + 8]), Y[i:i + 8]) / K
    loss.backward()
    micro += 1
    if micro % K == 0:
        opt.step()
        opt.zero_grad(set_to_none=True)
