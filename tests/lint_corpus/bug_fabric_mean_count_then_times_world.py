# corpus: style=fabric class=F10
# the window's token count from fabric.all_reduce (a mean by default), the loss divided by it
# first and then multiplied by the world size (blind round 122 c_b02): every token weighs W x
import lightning as L

fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
fabric.launch()
model, optimizer = fabric.setup(model, optimizer)
for window in windows(loader, accum_steps):
    n_tok = sum(b["mask"].sum() for b in window).float()
    n_tok = fabric.all_reduce(n_tok)
    for i, batch in enumerate(window):
        with fabric.no_backward_sync(model, enabled=i < len(window) - 1):
            loss = token_loss_sum(model, batch) / n_tok * fabric.world_size  # expect: AG321
            fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
