# corpus: style=closure class=OK
# LBFGS with a closure: backward runs inside the closure, step once per batch.
import torch

optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0)
for x, y in loader:
    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    optimizer.step(closure)
