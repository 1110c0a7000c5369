# corpus: style=accelerate class=F4
"""The scheduler is prepared, but step_scheduler_with_optimizer=False turns off Accelerate's
gate: stepping it on every micro-batch advances the schedule K times per update."""
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8, step_scheduler_with_optimizer=False)
model = build_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, build_loader(), scheduler)

for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()  # expect: AG103
        optimizer.zero_grad()
