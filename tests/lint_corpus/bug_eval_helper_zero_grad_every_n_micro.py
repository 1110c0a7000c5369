# corpus: style=plain class=F3
# an evaluation every EVAL_EVERY micro-batches (meant as updates) frees memory with zero_grad:
# it fires inside windows and erases the gradient accumulated so far
import torch

CFG = {"accum_steps": 4, "eval_every": 6}


def evaluate(model, optimizer, val_batches):
    optimizer.zero_grad(set_to_none=True)  # expect: AG102
    model.eval()
    with torch.no_grad():
        acc = sum((model(x).argmax(-1) == y).float().mean().item() for x, y in val_batches)
    model.train()
    return acc / len(val_batches)


def train(model, optimizer, loader, val_batches):
    K = CFG["accum_steps"]
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / K
        loss.backward()
        if (step + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step > 0 and step % CFG["eval_every"] == 0:
            print("val acc", evaluate(model, optimizer, val_batches))
