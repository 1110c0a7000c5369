# corpus: style=distill class=OK
# the hint term backwarded on its own, divided by accum like the main loss
import torch

accum = 4
opt = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler()
for step in range(steps):
    for j in range(accum):
        x, y = batches[step * accum + j]
        loss = kd_loss(student(x), teacher(x), y) / accum
        scaler.scale(loss).backward(retain_graph=True)
        scaler.scale(hint_weight * hint_loss(student) / accum).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
