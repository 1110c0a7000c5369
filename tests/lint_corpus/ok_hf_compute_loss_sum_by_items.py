# corpus: style=hf class=OK
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class ShiftTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits[:, :-1, :]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
        )
        loss = loss / num_items_in_batch
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4, per_device_train_batch_size=4)
ShiftTrainer(model=model, args=args, train_dataset=ds).train()
