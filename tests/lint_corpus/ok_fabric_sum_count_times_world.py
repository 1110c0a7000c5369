# corpus: style=fabric class=OK
# the window's token count summed over the ranks (N), the loss times the world size: DDP's
# average leaves every token 1/N
import lightning as L

fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(model, optimizer)
for window in windows(loader, accum_steps):
    n_tokens = sum((b["labels"] != -100).sum() for b in window).float()
    n_tokens = fabric.all_reduce(n_tokens, reduce_op="sum")
    for i, batch in enumerate(window):
        with fabric.no_backward_sync(model, enabled=i < len(window) - 1):
            loss = token_loss_sum(model, batch) * fabric.world_size / n_tokens
            fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
