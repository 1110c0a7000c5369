# corpus: style=plain class=F4
# a functional loop: a module-level train_step does the forward and backward, the loop steps
# every K micro-batches, and the cosine horizon counts micro-batches
import torch
from transformers import get_cosine_schedule_with_warmup

HP = {"accum_steps": 8, "epochs": 2, "warmup_ratio": 0.1}


def train_step(model, batch, accum_steps):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x), y) / accum_steps
    loss.backward()
    return loss.item()


def train(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total_steps = len(loader) * HP["epochs"]
    sched = get_cosine_schedule_with_warmup(opt, int(HP["warmup_ratio"] * total_steps), total_steps)  # expect: AG124
    step = 0
    for _ in range(HP["epochs"]):
        for batch in loader:
            train_step(model, batch, HP["accum_steps"])
            step += 1
            if step % HP["accum_steps"] == 0:
                opt.step()
                sched.step()
                opt.zero_grad()
