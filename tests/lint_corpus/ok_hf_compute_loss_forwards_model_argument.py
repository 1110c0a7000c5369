# corpus: style=hf_trainer class=OK
# the same loss through the model argument; self.model read only for its config
from transformers import Trainer, TrainingArguments


class LoggingTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        self.log_batch(outputs, self.model.config.vocab_size)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


args = TrainingArguments(output_dir="out", gradient_accumulation_steps=4)
LoggingTrainer(model=model, args=args, train_dataset=ds).train()
