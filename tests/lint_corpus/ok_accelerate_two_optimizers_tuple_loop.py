# corpus: style=accelerate class=OK
"""Two prepared optimizers and schedulers stepped through one tuple loop inside
accumulate(): Accelerate gates each prepared optimizer's step and zero_grad."""
import torch
import torch.nn.functional as F
from accelerate import Accelerator

ACCUM = 4
acc = Accelerator(gradient_accumulation_steps=ACCUM)
model = build_model()
opt_body = torch.optim.AdamW(model.body.parameters(), lr=1e-3)
opt_head = torch.optim.SGD(model.head.parameters(), lr=0.05)
sched_body = torch.optim.lr_scheduler.LambdaLR(opt_body, lambda s: 1.0)
sched_head = torch.optim.lr_scheduler.StepLR(opt_head, 10)
model, opt_body, opt_head, loader, sched_body, sched_head = acc.prepare(
    model, opt_body, opt_head, make_loader(), sched_body, sched_head)

for x, y in loader:
    with acc.accumulate(model):
        acc.backward(F.cross_entropy(model(x), y))
        for opt, sched in ((opt_body, sched_body), (opt_head, sched_head)):
            opt.step()
            sched.step()
            opt.zero_grad()
