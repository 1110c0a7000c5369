# corpus: style=nanogpt class=F13
# micro_step is bumped before the test, so it is 1 on the first micro-batch; `% K == 1` then
# steps after the very first backward: a first window of 1 micro-batch, then windows of K
import torch

gradient_accumulation_steps = 8
model = GPT(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
micro_step = 0
X, Y = get_batch("train")
while iter_num < max_iters:
    logits, loss = model(X, Y)
    loss = loss / gradient_accumulation_steps
    X, Y = get_batch("train")
    loss.backward()
    micro_step += 1
    if micro_step % gradient_accumulation_steps == 1:  # expect: AG115
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
