# corpus: style=accelerate class=OK
# the horizon counts optimizer updates and is multiplied by the scheduler's ticks per update,
# a local name for accelerator.num_processes: the prepared scheduler ends on time
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

cfg = parse_config()
accelerator = Accelerator(gradient_accumulation_steps=cfg.accum)
rows = cfg.micro_bsz * cfg.accum * accelerator.num_processes * cfg.total_updates
loader = DataLoader(make_rows(rows), batch_size=cfg.micro_bsz)
optim = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
ticks = accelerator.num_processes  # the prepared scheduler advances once per process per update
warmup = get_linear_schedule_with_warmup(
    optim, num_warmup_steps=cfg.warmup * ticks, num_training_steps=cfg.total_updates * ticks
)
net, optim, loader, warmup = accelerator.prepare(net, optim, loader, warmup)
for batch in loader:
    with accelerator.accumulate(net):
        accelerator.backward(net(**batch).loss)
        optim.step()
        warmup.step()
        optim.zero_grad()
