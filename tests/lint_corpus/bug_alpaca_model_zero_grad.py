# corpus: style=alpaca class=F3
def train_epoch(model, optimizer, loader, gradient_accumulation_steps):
    model.train()
    for step, batch in enumerate(loader):
        model.zero_grad()  # expect: AG102
        outputs = model(**batch)
        loss = outputs.loss / gradient_accumulation_steps
        loss.backward()
        if (step + 1) % gradient_accumulation_steps == 0:  # expect: AG117
            optimizer.step()
