# corpus: style=nanogpt class=LOSS_SCALE
import torch
import torch.nn.functional as F

gradient_accumulation_steps = 5 * 8
max_iters = 600
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
scaler = torch.cuda.amp.GradScaler(enabled=False)


def get_batch():
    x = torch.randn(12, 64)
    return x, x.argmax(-1)


def micro_loss(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    return F.cross_entropy(logits.float(), y) / gradient_accumulation_steps


for it in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        X, Y = get_batch()
        loss = micro_loss(X, Y)
        loss = loss / gradient_accumulation_steps  # expect: AG133
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
