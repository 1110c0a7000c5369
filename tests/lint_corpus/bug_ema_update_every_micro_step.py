# corpus: style=timm class=F4
# timm-style weight EMA updated after every backward, while the optimizer steps every K
import torch
from timm.utils import ModelEmaV3

model = build_model()
model_ema = ModelEmaV3(model, decay=0.9998)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
accum_steps = 8
for batch_idx, (images, target) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(images), target) / accum_steps
    loss.backward()
    if (batch_idx + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model_ema.update(model, step=batch_idx)  # expect: AG158
