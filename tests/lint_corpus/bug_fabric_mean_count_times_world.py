# corpus: style=fabric class=F10
# the window's token count from fabric.all_reduce, whose reduce_op defaults to a mean (N / W);
# the loss is also multiplied by the world size: every token weighs W x
import lightning as L

fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(model, optimizer)
for window in windows(loader, accum_steps):
    n_tokens = sum((b["labels"] != -100).sum() for b in window).float()
    n_tokens = fabric.all_reduce(n_tokens)
    for i, batch in enumerate(window):
        with fabric.no_backward_sync(model, enabled=i < len(window) - 1):
            loss = token_loss_sum(model, batch) * fabric.world_size / n_tokens  # expect: AG321
            fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
