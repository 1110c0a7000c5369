# corpus: style=accelerate class=OK
# the same horizon in scheduler steps: updates times the processes that each step it
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

cfg = parse_config()
accelerator = Accelerator(gradient_accumulation_steps=cfg.accum)
rows = cfg.micro_bsz * cfg.accum * accelerator.num_processes * cfg.total_updates
loader = DataLoader(make_rows(rows), batch_size=cfg.micro_bsz)
optim = torch.optim.AdamW(net.parameters(), lr=cfg.lr)
warmup = get_linear_schedule_with_warmup(
    optim, num_warmup_steps=cfg.warmup * accelerator.num_processes,
    num_training_steps=cfg.total_updates * accelerator.num_processes,
)
net, optim, loader, warmup = accelerator.prepare(net, optim, loader, warmup)
for batch in loader:
    with accelerator.accumulate(net):
        accelerator.backward(net(**batch).loss)
        optim.step()
        warmup.step()
        optim.zero_grad()
