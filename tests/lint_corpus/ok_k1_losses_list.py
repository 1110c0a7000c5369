# corpus: style=multi_loss class=OK
# Several heads, losses collected in a list and summed: one backward, one step.
import torch

optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step, batch in enumerate(train_loader):
    losses = []
    for head in heads:
        losses.append(head.loss(net(batch.x), batch.y))
    total_loss = sum(losses) / len(losses)
    optimizer.zero_grad(set_to_none=True)
    total_loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(step, total_loss.item())
