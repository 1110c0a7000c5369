# corpus: style=plain class=OK
# `i % K == 0` opens the window (zero_grad before the first backward); the step closes it.
K = 4
for i, (x, y) in enumerate(loader):
    if i % K == 0:
        optimizer.zero_grad()
    (criterion(model(x), y) / K).backward()
    if i % K == K - 1:
        optimizer.step()
