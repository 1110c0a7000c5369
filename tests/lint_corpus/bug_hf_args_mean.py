# corpus: style=hf class=F5
for step, batch in enumerate(train_dataloader):
    outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    loss = outputs.loss / args.gradient_accumulation_steps  # expect: AG104
    loss.backward()
    if (step + 1) % args.gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
