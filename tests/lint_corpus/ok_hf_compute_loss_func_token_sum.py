# corpus: style=hf_trainer class=OK
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

SETTINGS = {
    "args": dict(per_device_train_batch_size=4, gradient_accumulation_steps=8, learning_rate=1e-4),
}


def shifted_lm_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1]
    target = labels[:, 1:]
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100,
                            reduction="sum")
    return total / num_items_in_batch


def build(model, data):
    args = TrainingArguments(output_dir="out", **SETTINGS["args"])
    return Trainer(model=model, args=args, train_dataset=data, compute_loss_func=shifted_lm_loss)
