# corpus: style=while_loop class=OK
import torch

accum_iter = 4
micro_step = 0
data = iter(loader)
while micro_step < total_micro_steps:
    x, y = next(data)
    loss = loss_fn(model(x), y) / accum_iter
    loss.backward()
    micro_step += 1
    if micro_step % accum_iter == 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
