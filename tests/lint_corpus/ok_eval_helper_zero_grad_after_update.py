# corpus: style=plain class=OK
# the same evaluation triggered by the update counter inside the boundary block, right after
# the step: its zero_grad clears an already empty gradient
import torch

CFG = {"accum_steps": 4, "eval_every": 6}


def evaluate(model, optimizer, val_batches):
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        acc = sum((model(x).argmax(-1) == y).float().mean().item() for x, y in val_batches)
    model.train()
    return acc / len(val_batches)


def train(model, optimizer, loader, val_batches):
    K = CFG["accum_steps"]
    updates = 0
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / K
        loss.backward()
        if (step + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updates += 1
            if updates % CFG["eval_every"] == 0:
                print("val acc", evaluate(model, optimizer, val_batches))
