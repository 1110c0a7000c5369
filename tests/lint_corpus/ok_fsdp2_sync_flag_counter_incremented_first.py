# corpus: style=fsdp2 class=OK
# the micro-step counter is incremented before the test, so `micro_step % ACCUM == 0` is the
# window's last micro-step: the sync falls where the optimizer steps
import torch.nn.functional as F

ACCUM = 4
micro_step = 0
for xb, yb in batches:
    micro_step += 1
    model.set_requires_gradient_sync(micro_step % ACCUM == 0)
    loss = F.mse_loss(model(xb), yb) / ACCUM
    loss.backward()
    if micro_step % ACCUM == 0:
        opt.step()
        opt.zero_grad()
