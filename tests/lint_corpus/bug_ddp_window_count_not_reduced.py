# corpus: style=ddp class=F6
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(lm)
K = 4
for step in range(num_steps):
    window = [next(batches) for _ in range(K)]
    window_tokens = sum(int((b["labels"] != -100).sum()) for b in window)
    for j, b in enumerate(window):
        ctx = model.no_sync() if j < K - 1 else contextlib.nullcontext()
        with ctx:
            loss_sum = torch.nn.functional.cross_entropy(
                model(b["input_ids"]).flatten(0, 1), b["labels"].flatten(), reduction="sum")
            (loss_sum / window_tokens).backward()  # expect: AG113
    optimizer.step()
    optimizer.zero_grad()
