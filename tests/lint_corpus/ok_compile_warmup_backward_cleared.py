# corpus: style=nanogpt class=OK
# one forward and backward through the compiled model before the loop, to compile both
# graphs, then clears its gradient before the loop, which clears only after each step
import torch

model = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
X, Y = get_batch("train")
_, loss = model(X, Y)
loss.backward()
model.zero_grad(set_to_none=True)
for it in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        _, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
