# corpus: style=nanogpt class=OK
# `% K == 1` on a 0-based counter after the backward is right for K = 2 (micro-batches 0 and 1,
# then 2 and 3, ...), and K is 2 here
import torch

gradient_accumulation_steps = 2
model = GPT(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
micro_step = 0
X, Y = get_batch("train")
while iter_num < max_iters:
    logits, loss = model(X, Y)
    loss = loss / gradient_accumulation_steps
    X, Y = get_batch("train")
    loss.backward()
    if micro_step % gradient_accumulation_steps == 1:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
    micro_step += 1
