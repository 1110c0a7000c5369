# corpus: style=hf class=OK
# torchtitan-style: sum the token losses, divide by the window's token count
import torch
import torch.nn.functional as F


def train_step(model, optimizer, micro_batches):
    num_tokens = sum(int((mb["labels"] != -100).sum()) for mb in micro_batches)
    for mb in micro_batches:
        logits = model(mb["input_ids"], attention_mask=mb["attention_mask"])
        loss = F.cross_entropy(
            logits.flatten(0, 1), mb["labels"].flatten(), ignore_index=-100, reduction="sum"
        )
        (loss / num_tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
