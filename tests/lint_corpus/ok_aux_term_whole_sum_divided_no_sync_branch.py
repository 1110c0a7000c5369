# corpus: style=ddp class=OK
import torch.nn.functional as F

K = grad_accum_steps
for i, (x, y) in enumerate(loader):
    pred, z_loss = model(x)
    loss = (F.mse_loss(pred, y) + z_coef * z_loss) / K
    if (i + 1) % K != 0:
        with model.no_sync():  # expect: AG116
            loss.backward()
    else:
        loss.backward()
        opt.step()
        opt.zero_grad()
