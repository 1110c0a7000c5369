# corpus: style=accelerate class=F4
# the script is written for several processes (it sizes its data with `n_proc`, a name for
# accelerator.num_processes) and sizes the prepared scheduler's horizon in optimizer updates:
# Accelerate steps a prepared scheduler num_processes times per update, so it ends W x early
from dataclasses import dataclass

from accelerate import Accelerator
from torch.optim.lr_scheduler import CosineAnnealingLR


@dataclass
class Cfg:
    accum: int = 4
    micro: int = 8
    updates: int = 200


cfg = Cfg()
acc = Accelerator(gradient_accumulation_steps=cfg.accum)
n_proc = acc.num_processes
sched = CosineAnnealingLR(opt, T_max=cfg.updates)  # expect: AG125
loader = make_loader(n_rows=cfg.micro * cfg.accum * n_proc * cfg.updates, batch_size=cfg.micro)
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
for batch in loader:
    with acc.accumulate(model):
        acc.backward(model(**batch).loss)
        opt.step()
        sched.step()
        opt.zero_grad()
