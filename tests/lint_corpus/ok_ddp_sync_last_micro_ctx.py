# corpus: style=ddp class=OK
# all-reduce once per window, on its last micro-step
from contextlib import nullcontext

from torch.nn.parallel import DistributedDataParallel

accum_iter = 4
model = DistributedDataParallel(Tagger())
for update in range(num_updates):
    for micro_step in range(accum_iter):
        sync_ctx = nullcontext() if micro_step == accum_iter - 1 else model.no_sync()
        with sync_ctx:
            loss = criterion(model(tokens[micro_step]), tags[micro_step]) / accum_iter
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
