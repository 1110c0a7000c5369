# corpus: style=epochs class=F13
# `i != 0 and i % K == 0` after the backward: the first window of every epoch has K + 1
# micro-batches (0..K).
for epoch in range(n_epochs):
    for i, (x, y) in enumerate(train_loader):
        loss = loss_fn(model(x), y) / grad_accum
        loss.backward()
        if i != 0 and i % grad_accum == 0:  # expect: AG115
            optimizer.step()
            optimizer.zero_grad()
