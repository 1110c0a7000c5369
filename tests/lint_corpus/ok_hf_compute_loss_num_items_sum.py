# corpus: style=hf class=OK
# summed over the micro-batch and divided by the window's token count: nothing else
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class TokenTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                               reduction="sum")
        loss = loss / num_items_in_batch
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments("out", per_device_train_batch_size=4, gradient_accumulation_steps=8)
TokenTrainer(model=model, args=args, train_dataset=ds).train()
