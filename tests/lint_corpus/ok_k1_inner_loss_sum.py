# corpus: style=k1 class=OK
# One backward per step on a loss summed over sub-batches (K = 1 for the optimizer).
import torch

model = torch.nn.Linear(16, 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
micro_batches_per_batch = 4

for batch in loader:
    optimizer.zero_grad()
    loss = 0.0
    for micro in batch.chunk(micro_batches_per_batch):
        loss = loss + torch.nn.functional.mse_loss(model(micro.x), micro.y)
    loss.backward()
    optimizer.step()
