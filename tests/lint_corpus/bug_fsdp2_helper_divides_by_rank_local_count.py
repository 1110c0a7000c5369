# corpus: style=fsdp2 class=F6
# the loss helper divides by the count it is given; the loop gives it this rank's own label
# tokens of the window, never all-reduced: FSDP2 averages rank-local means
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard


def token_loss(model, batch, denom):
    logits = model(batch["input_ids"])
    summed = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                             reduction="sum")
    return summed / denom  # expect: AG113


def train(model, windows, rank, world, steps):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        mine = windows[step][rank::world]
        n_tok = sum(int((b["labels"] != -100).sum()) for b in mine)
        for i, batch in enumerate(mine):
            model.set_requires_gradient_sync(i == len(mine) - 1)
            token_loss(model, batch, n_tok).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
