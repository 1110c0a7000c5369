# corpus: style=ddp class=F6
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(lm)
for window in windows:
    n_local = sum(int(b["mask"].sum()) for b in window)
    for b in window:
        tok = (model(b["x"]) - b["y"]).pow(2).sum(-1)
        (tok[b["mask"]].sum() / n_local).backward()  # expect: AG113
    optimizer.step()
    optimizer.zero_grad()
