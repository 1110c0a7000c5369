# corpus: style=nanogpt class=OK
# fp32 parameters and bf16 compute under autocast: the .grad buffers that accumulate are fp32
import torch

gradient_accumulation_steps = 16
model = GPT(gptconf)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
ctx = torch.autocast(device_type="cuda", dtype=torch.bfloat16)
while iter_num < max_iters:
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
