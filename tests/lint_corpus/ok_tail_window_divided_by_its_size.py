# corpus: style=plain class=OK


def fit(model, train_ds, val_ds, cfg):
    opt = get_optimizer(model, cfg)
    loader = get_loader(train_ds, cfg)
    n_updates = 0
    model.train()
    for epoch in range(cfg["epochs"]):
        running = 0.0
        for step, (x, y) in enumerate(loader):
            out = model(x)
            # a pass's last window may be short: each micro-step is divided by its window's size
            loss = criterion(out, y, cfg) / min(cfg["grad_accum"], len(loader) - step // cfg["grad_accum"] * cfg["grad_accum"])
            loss.backward()
            running += loss.item()
            if (step + 1) % cfg["grad_accum"] == 0 or step + 1 == len(loader):
                opt.step()
                opt.zero_grad()
                n_updates += 1
                print(f"epoch {epoch} update {n_updates} loss {running:.4f}")
                running = 0.0
        print(f"epoch {epoch} val_acc {accuracy(model, val_ds):.3f}")
    return n_updates
