# corpus: style=nanogpt class=F8
import torch

gradient_accumulation_steps = 8
grad_clip = 1.0
scaler = torch.cuda.amp.GradScaler(enabled=True)
for iter_num in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # expect: AG135
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
