# corpus: style=nanogpt class=F7
# one forward and backward through the compiled model before the loop, to compile both
# graphs; the loop clears gradients only after each optimizer step, so the warm-up's
# gradient is added to the first window's
import torch

model = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
X, Y = get_batch("train")
_, loss = model(X, Y)
loss.backward()  # expect: AG316
for it in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        _, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
