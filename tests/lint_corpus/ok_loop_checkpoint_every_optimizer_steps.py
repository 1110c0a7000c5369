# corpus: style=plain class=OK
# checkpoints counted in optimizer steps (inside the boundary block), and one every 8
# micro-batches with K = 4: both land on window boundaries
import torch

ACCUM = 4
SAVE_STEPS = 3
global_step = 0
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
        global_step += 1
        if global_step % SAVE_STEPS == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "global_step": global_step, "i": i}, "ckpt.pt")
    if (i + 1) % 8 == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "i": i + 1}, "last.pt")

ck = torch.load("last.pt")
i = ck["i"]
global_step = ck["global_step"]
