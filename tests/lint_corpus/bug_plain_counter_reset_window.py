# corpus: style=plain class=LOSS_SCALE
import torch
import torch.nn.functional as F

model = torch.nn.Linear(8, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(32)]
n = 8
seen = 0
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    loss.backward()  # expect: AG122
    seen += 1
    if seen == n:
        opt.step()
        opt.zero_grad()
        seen = 0
