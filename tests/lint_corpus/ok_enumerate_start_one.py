# corpus: style=hf class=OK
def train(model, optimizer, lr_scheduler, dataloader, gradient_accumulation_steps):
    model.train()
    for step, batch in enumerate(dataloader, start=1):
        loss = model(**batch).loss
        (loss / gradient_accumulation_steps).backward()  # expect: AG141
        if step % gradient_accumulation_steps == 0 or step == len(dataloader):
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
