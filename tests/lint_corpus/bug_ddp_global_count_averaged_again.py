# corpus: style=ddp_tokens class=F10
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

accum_steps = 4


def train_step(net, window):
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    n_valid = torch.tensor(sum(int((b["labels"] != -100).sum()) for b in window))
    dist.all_reduce(n_valid)
    for i, b in enumerate(window):
        ctx = model.no_sync() if i < accum_steps - 1 else torch.enable_grad()
        with ctx:
            logits = model(b["input_ids"])
            tok_loss = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="sum")
            loss = tok_loss / n_valid  # expect: AG123
            loss.backward()
    opt.step()
    opt.zero_grad()
