# corpus: style=nanogpt class=F12
# the whole GPT is cast to bf16 to save memory and 16 micro-batches accumulate into bf16 .grad
import torch

gradient_accumulation_steps = 16
model = GPT(gptconf)
model.to(torch.bfloat16)  # expect: AG120
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
while iter_num < max_iters:
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
