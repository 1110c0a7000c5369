# corpus: style=hf_trainer class=OK
# the same loss over the window's count only: the Trainer undoes DDP's average itself
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def completion_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].float()
    tok = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100,
                          reduction="sum")
    return tok / num_items_in_batch


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
Trainer(model=model, args=args, train_dataset=ds, compute_loss_func=completion_loss).train()
