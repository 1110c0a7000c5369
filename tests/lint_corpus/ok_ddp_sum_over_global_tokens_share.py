# corpus: style=ddp class=OK
# dividing by (all-reduced window tokens / W) multiplies by W: DDP's average then gives the
# window's summed loss over the global token count, not G / W
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(build_model())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
accum = 4
for step, batch in enumerate(loader):
    if step % accum == 0:
        window = batches[step: step + accum]
        global_tokens = torch.tensor(sum(int((b["labels"] != -100).sum()) for b in window))
        dist.all_reduce(global_tokens, op=dist.ReduceOp.SUM)
    logits = model(batch["input_ids"])
    loss_sum = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    loss = loss_sum / (global_tokens / dist.get_world_size())
    loss.backward()
    if (step + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
