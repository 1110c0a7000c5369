# corpus: style=hf class=OK
import torch
from transformers import Trainer, TrainingArguments


class ZLossTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        z = torch.logsumexp(outputs.logits.float(), dim=-1).pow(2).mean()
        loss = outputs.loss + 1e-4 * z / self.current_gradient_accumulation_steps
        return (loss, outputs) if return_outputs else loss


def main(model, train_ds):
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                             gradient_accumulation_steps=4, report_to="none", use_cpu=True)
    ZLossTrainer(model=model, args=args, train_dataset=train_ds).train()
