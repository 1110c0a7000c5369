# corpus: style=accelerate class=OK
# the script is written for several processes (it sizes its data with `n_proc`, a name for
# accelerator.num_processes); the prepared scheduler steps num_processes times per update, and
# its horizon counts those steps: updates x n_proc
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
sched = CosineAnnealingLR(opt, T_max=cfg.updates * n_proc)
loader = make_loader(n_rows=cfg.micro * cfg.accum * n_proc * cfg.updates, batch_size=cfg.micro)
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
for batch in loader:
    with acc.accumulate(model):
        acc.backward(model(**batch).loss)
        opt.step()
        sched.step()
        opt.zero_grad()
