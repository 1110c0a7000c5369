# corpus: style=epochs class=F4
for epoch in range(n_epochs):
    for step, batch in enumerate(loader):
        loss = model(batch).loss / args.gradient_accumulation_steps
        loss.backward()
        if (step + 1) % args.gradient_accumulation_steps == 0:  # expect: AG117
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()  # expect: AG103
