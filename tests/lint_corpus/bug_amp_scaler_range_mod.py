# corpus: style=amp class=F13
import torch

scaler = torch.cuda.amp.GradScaler()
accum_iter = 4
for it in range(num_iters):
    x, y = next(batches)
    with torch.autocast("cuda"):
        loss = model(x, y) / accum_iter
    scaler.scale(loss).backward()
    if it % accum_iter == 0:  # expect: AG115
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
