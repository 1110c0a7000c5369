# corpus: style=nanogpt class=OK
# nanoGPT-style: globals, an inner micro-step loop, DDP sync flag set before the forward
import os
import torch
from contextlib import nullcontext
from torch.nn.parallel import DistributedDataParallel as DDP

gradient_accumulation_steps = 5 * 8
grad_clip = 1.0
ddp = int(os.environ.get("RANK", -1)) != -1
model = GPT(config)
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
scaler = torch.cuda.amp.GradScaler(enabled=True)
if ddp:
    model = DDP(model, device_ids=[0])
ctx = nullcontext()
X, Y = get_batch("train")
iter_num = 0
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            # each .backward() is a grad sum; only the last micro step syncs
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > 5000:
        break
