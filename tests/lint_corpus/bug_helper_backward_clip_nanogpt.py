# corpus: style=nanogpt class=F8
import torch


def backward_and_clip(loss, model, grad_clip):
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # expect: AG105


gradient_accumulation_steps = 8
for iter_num in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        backward_and_clip(loss, model, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
