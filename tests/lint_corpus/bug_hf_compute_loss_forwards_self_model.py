# corpus: style=hf_trainer class=F10
# a custom loss that calls the Trainer's own module, not the (DDP-wrapped) model it is handed
from transformers import Trainer, TrainingArguments


class LoggingTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = self.model(**inputs, num_items_in_batch=num_items_in_batch)  # expect: AG306
        self.log_batch(outputs)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
LoggingTrainer(model=model, args=args, train_dataset=ds).train()
