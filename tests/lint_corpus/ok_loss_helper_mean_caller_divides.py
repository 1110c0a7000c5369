# corpus: style=nanogpt class=OK
import torch
import torch.nn.functional as F

gradient_accumulation_steps = 5 * 8
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)


def get_batch():
    x = torch.randn(12, 64)
    return x, x.argmax(-1)


def micro_loss(x, y):
    return F.cross_entropy(model(x), y)


for it in range(600):
    for micro_step in range(gradient_accumulation_steps):
        X, Y = get_batch()
        loss = micro_loss(X, Y)
        loss = loss / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
