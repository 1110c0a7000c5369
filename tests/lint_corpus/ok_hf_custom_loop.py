# corpus: style=hf class=OK
# transformers-style custom loop, token-normalised loss over the whole window.
import torch
from transformers import AutoModelForCausalLM, get_cosine_schedule_with_warmup

model = AutoModelForCausalLM.from_config(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
lr_scheduler = get_cosine_schedule_with_warmup(optimizer, 50, 1000)
gradient_accumulation_steps = 8

for update in range(num_updates):
    window = [next(batches) for _ in range(gradient_accumulation_steps)]
    num_items_in_batch = sum((b["labels"] != -100).sum() for b in window)
    for batch in window:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum"
        )
        (loss / num_items_in_batch).backward()
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
