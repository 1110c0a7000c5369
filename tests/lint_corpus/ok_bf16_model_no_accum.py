# corpus: style=plain class=OK
# a bf16 model without accumulation: one backward per optimizer step, nothing is summed in bf16
import torch


def train(model, loader, device):
    model = model.to(device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x.to(device, dtype=torch.bfloat16)), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
