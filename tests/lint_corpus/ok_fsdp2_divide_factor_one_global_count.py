# corpus: style=fsdp2 class=OK
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, fully_shard


def global_token_count(micro_batches):
    t = torch.tensor([float(sum((b["labels"] != -100).sum() for b in micro_batches))])
    dist.all_reduce(t)
    return t.item()


def fit(model, windows, accum=4):
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            mod.set_gradient_divide_factor(1.0)  # FSDP sums over ranks instead of averaging
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for micro_batches in windows:
        denom = global_token_count(micro_batches)
        for m, batch in enumerate(micro_batches):
            model.set_requires_gradient_sync(m == accum - 1)
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum") / denom
            loss.backward()
        opt.step()
        opt.zero_grad()
