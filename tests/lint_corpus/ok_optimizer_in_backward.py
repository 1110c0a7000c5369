# corpus: style=plain class=OK
import torch

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer_dict = {p: torch.optim.AdamW([p], lr=1e-3) for p in model.parameters()}
scheduler_dict = {p: torch.optim.lr_scheduler.CosineAnnealingLR(o, 1000) for p, o in optimizer_dict.items()}


def optimizer_hook(param):
    optimizer_dict[param].step()
    optimizer_dict[param].zero_grad()
    scheduler_dict[param].step()


for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)

for step in range(1000):
    x, y = next(data)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
