# corpus: style=epochs class=OK
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATION_STEPS = 4
loader = DataLoader(TensorDataset(torch.randn(50, 1, 8, 8), torch.randint(0, 4, (50,))), batch_size=5)
for epoch in range(2):
    n_batches = len(loader)
    for step, (x, y) in enumerate(loader):
        window = min(ACCUMULATION_STEPS, n_batches - (step // ACCUMULATION_STEPS) * ACCUMULATION_STEPS)
        (F.cross_entropy(model(x), y) / window).backward()
        if (step + 1) % ACCUMULATION_STEPS == 0 or step + 1 == n_batches:
            optimizer.step()
            optimizer.zero_grad()
