# corpus: style=hand_loop class=OK
# value clipping on the accumulated gradient at the boundary; a tensor hook that only records
# the gradient's norm changes nothing
import torch

accum = 4
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
norms = []
for p in model.parameters():
    p.register_hook(lambda g: norms.append(float(g.norm())))
for i, (x, y) in enumerate(loader):
    (loss_fn(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
