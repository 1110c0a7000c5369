# corpus: style=epochs class=OK
# the partial window at the end of an epoch is dropped explicitly (zero_grad at every epoch start)
def train_one_epoch(model, loader, optimizer, accum_steps):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(loader):
        (model(batch).loss / accum_steps).backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
