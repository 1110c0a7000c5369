# corpus: style=accelerate class=F4
# the horizon counts optimizer updates, but the prepared scheduler steps once per process for
# each of them: on 2 processes the linear decay reaches 0 halfway
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

cfg = parse_config()
accelerator = Accelerator(gradient_accumulation_steps=cfg.accum)
rows = cfg.micro_bsz * cfg.accum * accelerator.num_processes * cfg.total_updates
loader = DataLoader(make_rows(rows), batch_size=cfg.micro_bsz)
optim = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
warmup = get_linear_schedule_with_warmup(  # expect: AG125
    optim, num_warmup_steps=cfg.warmup, num_training_steps=cfg.total_updates
)
net, optim, loader, warmup = accelerator.prepare(net, optim, loader, warmup)
for batch in loader:
    with accelerator.accumulate(net):
        accelerator.backward(net(**batch).loss)
        optim.step()
        warmup.step()
        optim.zero_grad()
