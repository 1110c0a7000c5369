# corpus: style=fabric class=OK
# the window's token count summed over the ranks, the loss divided by it first and then
# multiplied by the world size (the engine's average over the ranks cancels the W)
import lightning as L

fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(model, optimizer)
for window in windows(loader, accum_steps):
    n_tok = sum(b["mask"].sum() for b in window).float()
    n_tok = fabric.all_reduce(n_tok, reduce_op="sum")
    for i, batch in enumerate(window):
        with fabric.no_backward_sync(model, enabled=i < len(window) - 1):
            loss = token_loss_sum(model, batch) / n_tok * fabric.world_size
            fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
