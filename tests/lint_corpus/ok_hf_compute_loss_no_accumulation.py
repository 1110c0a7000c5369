# corpus: style=hf class=OK
# a mean loss per batch is right when there is no accumulation (GA defaults to 1)
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


class FocalTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits, labels)
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", per_device_train_batch_size=32)
FocalTrainer(model=model, args=args, train_dataset=ds).train()
