# corpus: style=hf class=OK
from transformers import Trainer, TrainingArguments


class LoggingTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        self.log({"aux": outputs.logits.abs().mean().item()})
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
LoggingTrainer(model=model, args=args, train_dataset=ds).train()
