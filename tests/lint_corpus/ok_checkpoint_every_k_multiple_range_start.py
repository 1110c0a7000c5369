# corpus: style=resume class=OK
# a checkpoint every 6 micro-batches with K = 3 (on a boundary), resumed by starting the
# micro-batch loop at the saved counter
import torch

K, save_every, total = 3, 6, 12
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if resume:
    ck = torch.load("ckpt.pt")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    start = ck["micro_step"]
for micro_step in range(start, total):
    (model(batch(micro_step)).mean() / K).backward()
    if (micro_step + 1) % K == 0:
        opt.step()
        opt.zero_grad()
    if (micro_step + 1) % save_every == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "micro_step": micro_step + 1}, "ckpt.pt")
