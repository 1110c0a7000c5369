# corpus: style=plain class=F1
import torch

ACCUM = 4
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer_dict = {p: torch.optim.AdamW([p], lr=1e-3) for p in model.parameters()}


def optimizer_hook(param):
    optimizer_dict[param].step()  # expect: AG137
    optimizer_dict[param].zero_grad()


for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)

for step in range(1000):
    for _ in range(ACCUM):
        x, y = next(data)
        loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
        loss.backward()
