# corpus: style=accelerate class=OK
"""step_scheduler_with_optimizer=False: the loop steps the prepared scheduler itself, only
when Accelerate synchronises (once per update)."""
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
        if accelerator.sync_gradients:
            scheduler.step()
        optimizer.zero_grad()
